"""What the refresh pages show, built from the database (the journal is the truth)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from controlplane.dynamo.fingerprint import AgreementRule, Fingerprint, quote
from controlplane.refresh.actions import can_end, is_membership_hold
from controlplane.refresh.gates import displayed_reason
from controlplane.refresh.models import (
    ACTIVE_STATES,
    Gate,
    GateState,
    JournalEntry,
    PolicyRefresh,
    RefreshState,
    StepRun,
    WorkerStepResult,
)
from controlplane.refresh.namespaces import verified_namespaces
from controlplane.refresh.sequence import ORDER, STATE_STEP, STEP_LABELS, WORKER_STEPS, StepName


@dataclass
class Cell:
    worker_id: int
    step: str
    status: str = "pending"  # pending|running|ok|failed|skipped|unreached
    error: str = ""
    ms: float | None = None

    @property
    def dom_id(self) -> str:
        return f"cell-{self.worker_id}-{self.step}"


@dataclass
class GridRow:
    worker: Any
    cells: list[Cell] = field(default_factory=list)
    #: The worker's call timeline: one dict per journaled call, oldest first.
    calls: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class StepLine:
    name: str
    label: str
    status: str = "pending"
    detail: str = ""
    ms: float | None = None
    attempts: int = 0


def current_step(refresh: PolicyRefresh) -> str | None:
    step = STATE_STEP.get(RefreshState(refresh.state))
    return step.value if step else None


def step_lines(refresh: PolicyRefresh) -> list[StepLine]:
    runs: dict[str, StepRun] = {}
    counts: dict[str, int] = {}
    for run in StepRun.objects.filter(refresh=refresh).order_by("id"):
        runs[run.name] = run
        counts[run.name] = counts.get(run.name, 0) + 1
    names = list(ORDER) + ([StepName.RELEASE] if StepName.RELEASE in runs else [])
    lines = []
    for name in names:
        found = runs.get(name)
        line = StepLine(name.value, STEP_LABELS[name], attempts=counts.get(name, 0))
        if found is not None:
            line.status, line.detail, line.ms = found.status, found.detail, found.duration_ms
        lines.append(line)
    return lines


def grid(refresh: PolicyRefresh) -> list[GridRow]:
    latest: dict[tuple[int, str], WorkerStepResult] = {}
    for result in WorkerStepResult.objects.filter(refresh=refresh).order_by("id"):
        latest[(result.planned_worker_id, result.step)] = result
    timeline: dict[int, list[dict[str, Any]]] = {}
    for call in (
        JournalEntry.objects.filter(refresh=refresh, planned_worker__isnull=False)
        .order_by("id")
        .values("planned_worker_id", "step", "operation", "ok", "duration_ms", "started_at")
    ):
        timeline.setdefault(call["planned_worker_id"], []).append(
            {
                "op": call["operation"],
                "ok": call["ok"],
                "ms": call["duration_ms"],
                "at": call["started_at"],
                "step": call["step"],
            }
        )
    running = current_step(refresh)
    rows = []
    for worker in refresh.workers.all():
        row = GridRow(worker, calls=timeline.get(worker.pk, []))
        for step in WORKER_STEPS:
            cell = Cell(worker.pk, step.value)
            last = latest.get((worker.pk, step.value))
            if last is not None:
                cell.status, cell.error, cell.ms = last.status, last.error, last.duration_ms
            if step.value == running and (last is None or last.status != "ok"):
                cell.status = "running"
            row.cells.append(cell)
        rows.append(row)
    return rows


#: Journal rows shown on the refresh page (newest first); the API serves the full journal.
JOURNAL_LIMIT = 500


def latest_journal(refresh: PolicyRefresh):
    return (
        JournalEntry.objects.filter(refresh=refresh)
        .select_related("planned_worker")
        .order_by("-id")[:JOURNAL_LIMIT]
    )


def agreement_summary(refresh: PolicyRefresh) -> str:
    """The cross-worker rule this refresh is verified with, in words."""
    verification = refresh.verification or {}
    if not verification.get("generation"):
        return "off (no generation check)"
    try:
        return AgreementRule.from_dict(verification.get("agreement")).describe()
    except ValueError:
        return "invalid rule stored"


def fingerprint_summary(refresh: PolicyRefresh) -> str:
    """The trainer fingerprint in words, with the expected ids quoted; "" when none."""
    if not refresh.fingerprint:
        return ""
    try:
        fp = Fingerprint.from_dict(refresh.fingerprint)
    except ValueError:
        return "invalid fingerprint stored"
    text = fp.describe()
    if fp.completion_token_ids:
        text += f": expected ids {quote(fp.completion_token_ids)}"
    return text


def verification_summary(refresh: PolicyRefresh) -> str:
    fingerprint = fingerprint_summary(refresh)
    text = f"workers must agree: {agreement_summary(refresh)}"
    return f"{text}; trainer fingerprint: {fingerprint}" if fingerprint else text


@dataclass
class NamespaceGate:
    """One namespace of a refresh and what its gate says now, in words."""

    namespace: str
    state: str
    text: str
    #: The refresh still holds this namespace (its gate closes and opens with the refresh).
    held_here: bool
    #: How the namespace was resolved on its own, if it was ("force_reopened", "reopened").
    outcome: str = ""
    gate_id: int | None = None


def _gate_text(gate: Gate) -> str:
    if gate.state == GateState.OPEN:
        text = (
            f"open at {gate.verified_version!r} for {len(gate.verified_instances)} verified "
            f"worker{'' if len(gate.verified_instances) == 1 else 's'}"
        )
        if gate.unverified_count:
            text += f" ({gate.unverified_count} serving outside the verified set)"
        return text
    if gate.state == GateState.OPEN_FORCED:
        return f"open (forced) by {gate.forced_by}: {gate.reason}"
    reason = displayed_reason(gate)
    return f"{gate.get_state_display()}: {reason}" if reason else gate.get_state_display()


def namespace_gates(refresh: PolicyRefresh) -> list[NamespaceGate]:
    """Per namespace of the refresh: its gate's state, what it says, who holds it."""
    gates = {
        g.namespace: g
        for g in Gate.objects.filter(
            source=refresh.source, namespace__in=refresh.namespaces
        ).select_related("source")
    }
    resolved = refresh.resolved_namespaces or {}
    rows = []
    for namespace in refresh.namespaces:
        gate = gates.get(namespace)
        outcome = (resolved.get(namespace) or {}).get("outcome", "")
        if gate is None:
            rows.append(NamespaceGate(namespace, "open", "open: never gated", False, outcome))
            continue
        rows.append(
            NamespaceGate(
                namespace,
                gate.state,
                _gate_text(gate),
                gate.active_refresh_id == refresh.pk,
                outcome,
                gate.pk,
            )
        )
    return rows


def recovery_context(refresh: PolicyRefresh) -> dict[str, Any]:
    """What the held refresh's recoveries need: per-namespace gates, which namespaces passed
    verify (for "reopen all verified") and whether a membership change holds it."""
    held = refresh.state == RefreshState.HELD
    return {
        "namespace_gates": namespace_gates(refresh),
        "verified_namespaces": verified_namespaces(refresh) if held else [],
        "membership_hold": is_membership_hold(refresh),
        "membership_change": refresh.membership_change or {},
    }


def detail_context(refresh: PolicyRefresh) -> dict[str, Any]:
    """Everything the refresh page and its live stream render, from the database."""
    return {
        "refresh": refresh,
        "steps": step_lines(refresh),
        "grid": grid(refresh),
        "worker_steps": [STEP_LABELS[s] for s in WORKER_STEPS],
        "is_active": refresh.state in ACTIVE_STATES,
        "can_end": can_end(refresh),
        "journal": latest_journal(refresh),
        "agreement": agreement_summary(refresh),
        "fingerprint": fingerprint_summary(refresh),
        **recovery_context(refresh),
    }


def active_refreshes(source=None):
    refreshes = PolicyRefresh.objects.filter(state__in=ACTIVE_STATES).select_related("source")
    if source is not None:
        refreshes = refreshes.filter(source=source)
    return list(refreshes)


def gates_of(source=None) -> list[Gate]:
    gates = Gate.objects.select_related("source", "active_refresh")
    if source is not None:
        gates = gates.filter(source=source)
    return list(gates)


#: The badge class of each gate state: a forced gate never looks like a verified one.
GATE_BADGE = {
    GateState.OPEN: "open",
    GateState.OPEN_FORCED: "forced",
    GateState.CLOSED: "closed",
    GateState.UNKNOWN: "unknown",
}


@dataclass
class GateRow:
    """One row of the Gates page (and of its live stream)."""

    gate: Gate
    reason: str
    badge: str

    @property
    def pk(self) -> int:
        return self.gate.pk


def gate_row(gate: Gate) -> GateRow:
    return GateRow(gate, displayed_reason(gate), GATE_BADGE.get(GateState(gate.state), "closed"))


def gate_rows(gates: list[Gate] | None = None) -> list[GateRow]:
    return [gate_row(g) for g in (gates if gates is not None else gates_of())]


def banner_context(source=None) -> dict[str, Any]:
    """The active refreshes of one source (or all); gate rows are asked for separately."""
    return {
        "banner_source": source,
        "banner_refreshes": active_refreshes(source),
        "held_state": RefreshState.HELD,
    }
