"""What the refresh pages show, built from the database (the journal is the truth)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from functools import cache
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.core.paginator import Page
from django.db.models import Count, Max
from django.urls import reverse

from controlplane.dynamo.fingerprint import AgreementRule, Fingerprint, quote
from controlplane.fleet.filters import SEARCH_MAX, paginate, parse_page
from controlplane.fleet.rows import pager
from controlplane.refresh import eta
from controlplane.refresh.gates import displayed_reason, versions_served
from controlplane.refresh.gridrows import Cell, GridRow, render_grid
from controlplane.refresh.inflight import in_flight_table
from controlplane.refresh.intents.queries import can_end, is_membership_hold, left_paused
from controlplane.refresh.intents.recovery import still_held_namespaces
from controlplane.refresh.membership import change_of
from controlplane.refresh.models import (
    ACTIVE_STATES,
    TERMINAL_STATES,
    Evidence,
    Gate,
    GateState,
    JournalEntry,
    PolicyRefresh,
    RefreshState,
    Serving,
    ServingInterval,
    StepRun,
    WorkerStepResult,
)
from controlplane.refresh.namespaces import outcome_in, verified_namespaces
from controlplane.refresh.plansummary import describe_duration, plan_summary
from controlplane.refresh.progress import previous_policy, previous_version
from controlplane.refresh.revisions import Revision, revision_history, version_key
from controlplane.refresh.step_order import ORDER, STATE_STEP, STEP_LABELS, WORKER_STEPS, StepName
from controlplane.refresh.windows import admitted_at


@dataclass
class StepLine:
    name: str
    label: str
    status: str = "pending"
    detail: str = ""
    ms: float | None = None
    attempts: int = 0


def current_step(refresh: PolicyRefresh) -> str | None:
    # By value: a state this module does not know yet (another step's) runs no step here.
    step = STATE_STEP.get(refresh.state)  # type: ignore[call-overload]
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


@dataclass(frozen=True, slots=True)
class GridFilter:
    """Which page of a refresh's worker-by-step grid a client shows: by namespace, a search over
    worker keys, and the page number; all in the URL, like the source page's worker table."""

    namespace: str = ""
    q: str = ""
    page: int = 1

    @classmethod
    def from_query(cls, query: Mapping[str, str]) -> GridFilter:
        return cls(
            namespace=(query.get("namespace") or "").strip(),
            q=(query.get("q") or "").strip()[:SEARCH_MAX],
            page=parse_page(query.get("page")),
        )

    def params(self) -> dict[str, str]:
        out = {"namespace": self.namespace, "q": self.q}
        out = {k: v for k, v in out.items() if v}
        if self.page != 1:
            out["page"] = str(self.page)
        return out

    @property
    def query(self) -> str:
        return urlencode(self.params())

    def with_page(self, page: int) -> GridFilter:
        return replace(self, page=page)

    def page_of(self, refresh: PolicyRefresh, *, with_calls: bool = False) -> Page:
        """One page of planned workers; their planned calls (large JSON) only when asked,
        for the plan preview: the live grid shows keys and results."""
        workers = refresh.workers.all()
        if not with_calls:
            workers = workers.defer("calls", "blockers")
        if self.namespace:
            workers = workers.filter(namespace=self.namespace)
        if self.q:
            workers = workers.filter(key__icontains=self.q)
        return paginate(workers.order_by("namespace", "key", "pk"), self.page, GRID_PAGE_SIZE)


#: Grid rows per page: 100 workers with their step cells and call timelines.
GRID_PAGE_SIZE = 100


def cells_of(refresh: PolicyRefresh, worker_ids: Iterable[int]) -> dict[int, list[Cell]]:
    """The step cells of these workers (one page of them), from their latest results."""
    ids = list(worker_ids)
    latest: dict[tuple[int, str], WorkerStepResult] = {}
    for result in WorkerStepResult.objects.filter(
        refresh=refresh, planned_worker_id__in=ids
    ).order_by("id"):
        latest[(result.planned_worker_id, result.step)] = result
    running = current_step(refresh)
    out: dict[int, list[Cell]] = {}
    for pk in ids:
        cells = out[pk] = []
        for step in WORKER_STEPS:
            cell = Cell(pk, step.value)
            last = latest.get((pk, step.value))
            if last is not None:
                cell.status, cell.error, cell.ms = last.status, last.error, last.duration_ms
            if step.value == running and (last is None or last.status != "ok"):
                cell.status = "running"
            cells.append(cell)
    return out


def grid(refresh: PolicyRefresh, workers: Iterable[Any] | None = None) -> list[GridRow]:
    """Grid rows of `workers` (a page of the refresh's planned workers; all when None):
    three queries whatever the fleet size, since only the page's results and calls are read."""
    workers = list(refresh.workers.all() if workers is None else workers)
    ids = [w.pk for w in workers]
    timeline: dict[int, list[dict[str, Any]]] = {}
    for call in (
        JournalEntry.objects.filter(refresh=refresh, planned_worker_id__in=ids)
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
    cells = cells_of(refresh, ids)
    return [GridRow(w, cells[w.pk], timeline.get(w.pk, [])) for w in workers]


def grid_namespaces(refresh: PolicyRefresh) -> list[tuple[str, int]]:
    """The refresh's namespaces with their planned workers, counted by the database."""
    return list(
        refresh.workers.order_by("namespace").values_list("namespace").annotate(n=Count("id"))
    )


#: Journal rows shown on the refresh page (newest first), each with its bodies (a long one cut
#: short: `refresh_tags.json_preview`). The API serves every call whole
#: (`/api/v1/refreshes/<id>/journal`); 50 keep the page small at any size.
JOURNAL_LIMIT = 50


def latest_journal(refresh: PolicyRefresh, after: int = 0):
    """The newest calls (only those with an id above `after`: what a client has not seen)."""
    return (
        JournalEntry.objects.filter(refresh=refresh, id__gt=after)
        .select_related("planned_worker")
        .order_by("-id")[:JOURNAL_LIMIT]
    )


#: What the journal filter's result choice keeps.
JOURNAL_STATES = {"ok": True, "failed": False}


@dataclass(frozen=True, slots=True)
class JournalFilter:
    """Which calls the refresh page's journal shows: by result, worker and step, one page of
    `JOURNAL_LIMIT` at a time, newest first. In the URL with a `j_` prefix (the grid owns the
    unprefixed names); each grid cell links here with its worker and step."""

    state: str = ""
    #: A planned worker's id (from a grid link), None for any.
    worker: int | None = None
    #: Part of a worker key (typed in the filter form).
    q: str = ""
    step: str = ""
    page: int = 1

    @classmethod
    def from_query(cls, query: Mapping[str, str]) -> JournalFilter:
        state = (query.get("j_state") or "").strip()
        worker = (query.get("j_worker") or "").strip()
        return cls(
            state=state if state in JOURNAL_STATES else "",
            worker=int(worker) if worker.isdigit() and len(worker) < 12 else None,
            q=(query.get("j_q") or "").strip()[:SEARCH_MAX],
            step=(query.get("j_step") or "").strip()[:64],
            page=parse_page(query.get("j_page")),
        )

    @property
    def live(self) -> bool:
        """Unfiltered first page: new calls are prepended live (elsewhere they may not fit)."""
        return not (self.state or self.worker or self.q or self.step or self.page != 1)

    def params(self) -> dict[str, str]:
        out = {
            "j_state": self.state,
            "j_worker": str(self.worker or ""),
            "j_q": self.q,
            "j_step": self.step,
        }
        out = {k: v for k, v in out.items() if v}
        if self.page != 1:
            out["j_page"] = str(self.page)
        return out

    @property
    def query(self) -> str:
        # Never empty: the pager's fallback ("page=1") would name the grid's page instead.
        return urlencode(self.params()) or "j_page=1"

    def with_page(self, page: int) -> JournalFilter:
        return replace(self, page=page)

    def page_of(self, refresh: PolicyRefresh) -> Page:
        calls = JournalEntry.objects.filter(refresh=refresh).select_related("planned_worker")
        if self.state:
            calls = calls.filter(ok=JOURNAL_STATES[self.state])
        if self.worker:
            calls = calls.filter(planned_worker_id=self.worker)
        if self.q:
            calls = calls.filter(planned_worker__key__icontains=self.q)
        if self.step:
            calls = calls.filter(step=self.step)
        return paginate(calls.order_by("-id"), self.page, JOURNAL_LIMIT)


def journal_context(refresh: PolicyRefresh, view: JournalFilter) -> dict[str, Any]:
    """One page of the journal as filtered, with the choices its filter form offers."""
    page = view.page_of(refresh)
    view = view.with_page(page.number)
    worker_key = ""
    if view.worker:
        worker_key = (
            refresh.workers.filter(pk=view.worker).values_list("key", flat=True).first() or ""
        )
    return {
        "journal": list(page.object_list),
        "journal_filter": view,
        "journal_pager": pager(view, page),
        "journal_worker_key": worker_key,
        "journal_steps": list(
            JournalEntry.objects.filter(refresh=refresh)
            .order_by("step")
            .values_list("step", flat=True)
            .distinct()
        ),
    }


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
    #: When the gate last changed state (shown as "closed since" while it is not admitting).
    since: datetime | None = None
    #: What the gate admitted when the refresh ended, from the serving ledger ("" while it
    #: runs): the page shows it apart from `text`, which is the gate now.
    then: str = ""

    @property
    def closed(self) -> bool:
        return self.state in (GateState.CLOSED, GateState.UNKNOWN)


def _gate_text(gate: Gate) -> str:
    if gate.state == GateState.OPEN:
        text = (
            f"open at {gate.verified_version} for {len(gate.verified_instances)} verified "
            f"worker{'' if len(gate.verified_instances) == 1 else 's'}"
        )
        if gate.unverified_count:
            text += f" ({gate.unverified_count} serving outside the verified set)"
        return text
    if gate.state == GateState.OPEN_MIXED:
        served = ", ".join(
            f"{v['count']} at {v['version']}" for v in versions_served(gate.admitted or [])
        )
        return f"open at mixed versions ({served}): pin rollouts to an instance"
    if gate.state == GateState.OPEN_FORCED:
        served = ", ".join(
            f"{v['count']} at {v['version']}" for v in versions_served(gate.admitted or [])
        )
        text = f"open (forced) by {gate.forced_by}: {gate.reason}"
        return f"{text}; admitted: {served}" if served else text
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
    ended_at = refresh.finished_at if refresh.state in TERMINAL_STATES else None
    then = admitted_at(refresh.source, refresh.namespaces, ended_at) if ended_at else {}
    rows = []
    for namespace in refresh.namespaces:
        gate = gates.get(namespace)
        outcome = outcome_in(refresh.resolved_namespaces, namespace)
        left = _then_text(then.get(namespace, [])) if ended_at else ""
        if gate is None:
            rows.append(
                NamespaceGate(
                    namespace, "unverified", "unverified: never gated", False, outcome, then=left
                )
            )
            continue
        rows.append(
            NamespaceGate(
                namespace,
                gate.state,
                _gate_text(gate),
                gate.active_refresh_id == refresh.pk,
                outcome,
                gate.pk,
                gate.since,
                then=left,
            )
        )
    return rows


def _then_text(admitted: list[dict[str, Any]]) -> str:
    """What a gate admitted at one moment, in words, from the ledger."""
    if not admitted:
        return "admitting nobody"
    parts = []
    for served in versions_served(admitted):
        forced = sum(
            1 for a in admitted if a["admission"] == "forced" and a["version"] == served["version"]
        )
        how = f"{forced} forced" if forced else "verified"
        parts.append(f"{served['count']} at {served['version']} ({how})")
    return f"admitting {len(admitted)}: " + ", ".join(parts)


def recovery_context(refresh: PolicyRefresh) -> dict[str, Any]:
    """What the held refresh's recoveries need: per-namespace gates, which namespaces passed
    verify (for "reopen all verified") and whether a membership change holds it."""
    held = refresh.state == RefreshState.HELD
    return {
        "namespace_gates": namespace_gates(refresh),
        "verified_namespaces": verified_namespaces(refresh) if held else [],
        "membership_hold": is_membership_hold(refresh),
        "membership_change": change_of(refresh),
    }


def head_context(refresh: PolicyRefresh) -> dict[str, Any]:
    """The cockpit, and the refresh's steps, gates and held reason: the small part a state
    change re-sends (no grid, no journal)."""
    return {"refresh": refresh} | actions_context(refresh)


def actions_context(refresh: PolicyRefresh) -> dict[str, Any]:
    """What the cockpit and its action buttons (with their dialogs) need. The dialogs are
    computed only when the buttons are rendered (a pushed head fetches its buttons over HTTP):
    templates call a callable context value."""
    recovery = recovery_context(refresh)
    gates_now = recovery["namespace_gates"]
    paused = paused_now(refresh)

    @cache
    def dialogs() -> dict[str, Any]:
        return consequences(refresh, gates_now, paused)

    return (
        {
            "is_active": refresh.state in ACTIVE_STATES,
            "can_end": can_end(refresh),
            "dialogs": lambda: dialogs()["dialogs"],
            "force_dialogs": lambda: dialogs()["force_dialogs"],
        }
        | recovery
        | cockpit_context(refresh, gates_now, paused)
    )


def detail_context(
    refresh: PolicyRefresh,
    view: GridFilter | None = None,
    journal_view: JournalFilter | None = None,
) -> dict[str, Any]:
    """Everything the refresh page renders, from the database: one page of the grid and one
    page of the journal."""
    view = view or GridFilter()
    planned = refresh.state == RefreshState.PLANNED
    page = view.page_of(refresh, with_calls=planned)
    view = view.with_page(page.number)
    rows = grid(refresh, page.object_list)
    return (
        head_context(refresh)
        | (plan_context(refresh) if planned else {})
        | journal_context(refresh, journal_view or JournalFilter())
        | {
            "detail_url": reverse("refresh:detail", args=[refresh.pk]),
            # What a grid page or filter swaps: the plan's table, or the live stream (its socket
            # follows the page the client shows).
            "grid_target": "#refresh-plan" if planned else "#refresh-stream",
            "grid": rows,
            "grid_html": render_grid(rows, len(WORKER_STEPS) + 2),
            "grid_filter": view,
            "grid_pager": pager(view, page),
            # The grid's parameters, kept by the journal's page links (ends with "&").
            "grid_keep": f"{view.query}&" if view.query else "",
            "grid_namespaces": grid_namespaces(refresh),
            # What each worker's pause did to its requests in flight (journal view).
            "in_flight": None if planned else in_flight_table(refresh),
            "worker_steps": [STEP_LABELS[s] for s in WORKER_STEPS],
            "agreement": agreement_summary(refresh),
            "fingerprint": fingerprint_summary(refresh),
            # What this page shows, so its live stream's resync sends only what is newer.
            "stream_query": stream_query(view, seen_marks(refresh)),
        }
    )


def plan_context(refresh: PolicyRefresh) -> dict[str, Any]:
    """The plan preview's summary, blockers with their fixes, and when the plan expires."""
    summary = plan_summary(refresh)
    return {
        "summary": summary,
        "expected_duration": describe_duration(summary.expected),
        "plan_expires_at": refresh.created_at + timedelta(seconds=settings.PLAN_EXPIRY_SECONDS),
    }


def stream_query(view: GridFilter, seen: Mapping[str, Any]) -> str:
    """The live stream's query string: the grid page shown and what the page already holds."""
    return urlencode(view.params() | {f"seen_{k}": v for k, v in seen.items()})


def seen_marks(refresh: PolicyRefresh) -> dict[str, Any]:
    """The newest journal entry and worker result ids: the grid and journal a page shows are
    exactly those of the database up to them (both tables are append-only)."""
    return {
        "state": refresh.state,
        "journal": JournalEntry.objects.filter(refresh=refresh).aggregate(m=Max("id"))["m"] or 0,
        "results": WorkerStepResult.objects.filter(refresh=refresh).aggregate(m=Max("id"))["m"]
        or 0,
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
    GateState.OPEN_MIXED: "mixed",
    GateState.OPEN_FORCED: "forced",
    GateState.CLOSED: "closed",
    GateState.UNKNOWN: "unknown",
    GateState.UNVERIFIED: "unverified",
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

    @property
    def consequence(self) -> Consequence:
        return gate_consequence(self.gate)


def gate_row(gate: Gate) -> GateRow:
    return GateRow(gate, displayed_reason(gate), GATE_BADGE.get(GateState(gate.state), "closed"))


def gate_rows(gates: list[Gate] | None = None) -> list[GateRow]:
    return [gate_row(g) for g in (gates if gates is not None else gates_of())]


def gate_badges_by_source(source_ids: Iterable[int]) -> dict[int, dict[str, Any]]:
    """Per source id, what `gate_badges` shows (its gates and active refreshes): two queries
    however many sources."""
    ids = set(source_ids)
    gates: dict[int, list[Gate]] = {pk: [] for pk in ids}
    for gate in Gate.objects.select_related("source", "active_refresh").filter(source_id__in=ids):
        gates[gate.source_id].append(gate)
    refreshes: dict[int, list[PolicyRefresh]] = {pk: [] for pk in ids}
    for refresh in PolicyRefresh.objects.filter(
        state__in=ACTIVE_STATES, source_id__in=ids
    ).select_related("source"):
        refreshes[refresh.source_id].append(refresh)
    return {
        pk: {
            "banner_refreshes": refreshes[pk],
            "banner_gates": gates[pk],
            "held_state": RefreshState.HELD,
        }
        for pk in ids
    }


def banner_context(source=None) -> dict[str, Any]:
    """The active refreshes of one source (or all); gate rows are asked for separately."""
    return {
        "banner_source": source,
        "banner_refreshes": active_refreshes(source),
        "held_state": RefreshState.HELD,
    }


# -- the rollback plan page ----------------------------------------------------------------------


@dataclass(frozen=True)
class RollbackNamespace:
    """One namespace a rollback may take back, and why it is ticked or not at first."""

    namespace: str
    state: str
    #: What its gate stands for now, in words.
    text: str
    #: Still held by the refresh being rolled back: the rollback must take it over.
    held: bool
    #: An approver forced it open: left out unless the operator ticks it.
    forced: bool


@dataclass(frozen=True)
class RollbackPage:
    source: Any
    of: PolicyRefresh | None
    revisions: list[Revision]
    namespaces: list[RollbackNamespace]
    initial: dict[str, Any]


def rollback_page(source, of: PolicyRefresh | None) -> RollbackPage:
    """The revision history of the source and its namespaces, with what the form starts with:
    the newest revision not current everywhere it is chosen (the one before the refresh being
    rolled back, when known), and every namespace of that refresh (else of the source) but the
    force-reopened ones."""
    history = revision_history(source)
    gates = {g.namespace: g for g in Gate.objects.filter(source=source).select_related("source")}
    held = set(still_held_namespaces(of)) if of is not None else set()
    scope = list(of.namespaces) if of is not None else sorted(gates)
    names = sorted(set(scope) | set(gates))
    rows = []
    for ns in names:
        gate = gates.get(ns)
        state = gate.state if gate else "unverified"
        rows.append(
            RollbackNamespace(
                ns,
                state,
                _gate_text(gate) if gate else "never gated",
                ns in held,
                state == GateState.OPEN_FORCED,
            )
        )
    before = previous_policy(of) if of is not None else None
    wanted = None
    if before and "weight_version" in before:
        wanted = version_key(before["weight_version"])
    if wanted is None or not any(r.key == wanted for r in history):
        target = version_key(of.weight_version) if of is not None else None
        wanted = next(
            (r.key for r in history if r.key != target and set(scope) - set(r.current_in)),
            history[0].key if history else None,
        )
    initial = {
        "version": wanted,
        "namespaces": [r.namespace for r in rows if r.namespace in scope and not r.forced],
    }
    return RollbackPage(source, of, history, rows, initial)


# -- the cockpit: the header on top of every refresh page ----------------------------------------

#: A state coming from the executor's abort handshake (`aborting` → `aborted`): the abort was
#: asked for and in-flight calls are being cancelled. Compared by value, so the page is ready
#: before the state is.
ABORTING = "aborting"
#: States after which the page offers next steps (plan again, roll back, ask for a reopen).
ENDED_BADLY = frozenset({RefreshState.ABORTED, RefreshState.FAILED, RefreshState.REJECTED})


@dataclass(frozen=True)
class CockpitRow:
    """One namespace in the cockpit: from which version to which, what is paused, and what
    trainers see (its gate now)."""

    gate: NamespaceGate
    current: Any
    target: Any
    paused: int
    workers: int

    @property
    def at_target(self) -> bool:
        return self.current is not None and version_key(self.current) == version_key(self.target)


@dataclass(frozen=True)
class NextStep:
    label: str
    url: str
    text: str
    id: str


def _versions_now(refresh: PolicyRefresh) -> dict[str, Any]:
    return dict(
        Gate.objects.filter(source=refresh.source, namespace__in=refresh.namespaces).values_list(
            "namespace", "verified_version"
        )
    )


def paused_now(refresh: PolicyRefresh) -> dict[str, int]:
    """Paused instances per namespace of the refresh: those the serving ledger says are paused
    (a wave in progress, any refresh's) or, if more, those this refresh paused and has not
    resumed (a held refresh leaves its workers as they are)."""
    counts = dict(
        ServingInterval.objects.filter(
            source=refresh.source,
            namespace__in=refresh.namespaces,
            valid_to__isnull=True,
            serving=Serving.PAUSED,
        )
        .order_by()
        .values_list("namespace")
        .annotate(n=Count("id"))
    )
    if refresh.started_at is not None:
        # Counted by the database per namespace (one statement), not listed and counted here.
        for namespace, n in (
            left_paused(refresh).order_by().values_list("namespace").annotate(n=Count("id"))
        ):
            counts[namespace] = max(counts.get(namespace, 0), n)
    return counts


def progress_of(refresh: PolicyRefresh, steps: list[StepLine]) -> tuple[int, int]:
    """(steps done, steps in all): a finished refresh counts full."""
    total = len(steps)
    if refresh.state == RefreshState.SUCCEEDED:
        return total, total
    return sum(1 for s in steps if s.status in ("ok", "skipped")), total


def next_steps(refresh: PolicyRefresh, gates_now: list[NamespaceGate]) -> list[NextStep]:
    """What a person can do after the refresh stopped short: plan again, roll back (through a
    plan), ask an approver to force-reopen a gate left closed."""
    if refresh.state not in ENDED_BADLY and refresh.state != RefreshState.HELD:
        return []
    closed = [g.namespace for g in gates_now if g.closed]
    reopen = NextStep(
        "Ask an approver to force-reopen",
        reverse("refresh:gates"),
        f"closed now: {', '.join(closed)}; an approver can open them on the Gates page",
        "next-reopen",
    )
    if refresh.state == RefreshState.HELD:  # its own buttons retry, roll back or abort
        return [reopen] if closed else []
    source = refresh.source
    steps = [
        NextStep(
            "Plan again",
            f"{reverse('refresh:plan')}?{urlencode({'source': source.name})}",
            "a new plan of this source, from a fresh discovery",
            "next-plan",
        )
    ]
    if has_revisions(source):
        steps.append(
            NextStep(
                "Roll back…",
                f"{reverse('refresh:rollback_plan', args=[source.pk])}?of={refresh.pk}",
                "choose an earlier verified version and the namespaces; review its plan",
                "next-rollback",
            )
        )
    if closed:
        steps.append(reopen)
    return steps


def has_revisions(source) -> bool:
    """Whether any version was ever verified on the source (one query)."""
    return ServingInterval.objects.filter(
        source=source, evidence=Evidence.VERIFIED_REFRESH
    ).exists()


def cockpit_context(
    refresh: PolicyRefresh, gates_now: list[NamespaceGate], paused: dict[str, int]
) -> dict[str, Any]:
    """The header of the refresh page: state, progress, estimated end, current → target per
    namespace, what is paused, what trainers see, and the next steps."""
    steps = step_lines(refresh)
    done, total = progress_of(refresh, steps)
    started = refresh.started_at is not None
    before = previous_version(refresh) if started else None
    now = _versions_now(refresh)
    workers = dict(grid_namespaces(refresh))
    rows = [
        CockpitRow(
            ng,
            before if before is not None else now.get(ng.namespace),
            refresh.weight_version,
            paused.get(ng.namespace, 0),
            workers.get(ng.namespace, 0),
        )
        for ng in gates_now
    ]
    return {
        "steps": steps,
        "cockpit": {
            "rows": rows,
            "done": done,
            "total": total,
            "eta": eta.estimate(refresh),
            "aborting": refresh.state == ABORTING,
            "paused": sum(paused.values()),
            "next_steps": next_steps(refresh, gates_now),
        },
    }


# -- dialogs: what a dangerous action will do, said before it is done ----------------------------


@dataclass(frozen=True)
class Consequence:
    """The content of one confirmation dialog, computed from the refresh and its gates."""

    action: str
    title: str
    confirm: str
    version: str
    namespaces: list[str]
    workers: str
    gates: str
    during: str
    after: str
    #: A namespace the dialog is about (force-reopen one), to tell dialogs apart.
    namespace: str = ""

    @property
    def dom_id(self) -> str:
        return f"dialog-{self.action}{'-' + self.namespace if self.namespace else ''}"


def _n(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def consequences(
    refresh: PolicyRefresh, gates_now: list[NamespaceGate], paused: dict[str, int]
) -> dict[str, Any]:
    """Per dangerous action on this refresh, what its dialog says: the version, namespaces,
    workers and gates it touches, and what trainers see during and after."""
    ns = list(refresh.namespaces)
    total = refresh.workers.count()
    paused_total = sum(paused.values())
    closed = [g.namespace for g in gates_now if g.closed]
    held_here = [g.namespace for g in gates_now if g.held_here]
    version = str(refresh.weight_version)
    previous = previous_version(refresh)
    old = str(previous) if previous is not None else "the version the gates stood for before"
    paused_words = (
        f"{_n(paused_total, 'worker')} paused now"
        + (f" ({', '.join(f'{k}: {v}' for k, v in sorted(paused.items()))})" if paused else "")
        if paused_total
        else "no worker paused now"
    )
    closed_words = (
        f"closed now: {', '.join(closed)}" if closed else "none closed now: rollouts admitted"
    )
    out: dict[str, Any] = {
        "abort": Consequence(
            "abort",
            f"Abort policy refresh #{refresh.pk}?",
            "Abort",
            f"{version} (stops short; no rollback)",
            ns,
            f"{_n(total, 'planned worker')}; {paused_words}",
            closed_words,
            "in-flight calls are cancelled; the page says aborting until the executor confirms",
            "gates that were closed stay closed with their reason; workers keep the version "
            "they have (a mixed fleet is possible); paused engines resume only if asked",
        ),
        "discard": Consequence(
            "discard",
            f"Discard plan #{refresh.pk}?",
            "Discard",
            f"{version} (never started)",
            ns,
            f"{_n(total, 'planned worker')}: none is called",
            "no gate changes",
            "nothing changes: the plan was never started",
            "nothing changes; the plan is kept in history as discarded",
        ),
        "end": Consequence(
            "end",
            f"End policy refresh #{refresh.pk} without calling any worker?",
            "End refresh",
            version,
            ns,
            f"none is called; {paused_words} stay as they are",
            f"{closed_words}; they stay closed",
            "nothing is called",
            "the scope is free for another refresh; closed gates stay closed until a refresh "
            "or a force-reopen opens them",
        ),
        "reject": Consequence(
            "reject",
            f"Reject policy refresh #{refresh.pk}?",
            "Reject",
            f"{version} (never runs)",
            ns,
            f"{_n(total, 'planned worker')}: none is called",
            "no gate changes",
            "nothing changes",
            f"trainers keep the gates as they are now; {version} is not installed",
        ),
        "reject_canary": Consequence(
            "reject_canary",
            f"Reject the canary of #{refresh.pk}?",
            "Reject canary",
            f"{version} → back to {old} on the canary",
            ns,
            "the canary workers are updated back, then the refresh holds",
            closed_words,
            "the canary workers pause while they go back; the rest keep serving",
            "the gates admit the old set; the refresh is held for a decision",
        ),
    }
    for namespace in held_here:
        gate_text = next((g.text for g in gates_now if g.namespace == namespace), "")
        out[f"force_reopen:{namespace}"] = Consequence(
            "force_reopen",
            f"Force-reopen {namespace} without verification?",
            f"Force-reopen {namespace}",
            "whatever each worker reports (read back first), not verified",
            [namespace],
            f"every live worker of {namespace}; {paused.get(namespace, 0)} paused there now resume",
            f"{namespace}: {gate_text}",
            "nothing until you confirm",
            f"/api/v1/gates says {namespace} is open (forced) by you, with your reason; "
            f"rollouts are admitted; #{refresh.pk} lets go of {namespace} and stays held on "
            "the rest",
            namespace,
        )
    return {"dialogs": out, "force_dialogs": [out[f"force_reopen:{n}"] for n in held_here]}


def gate_consequence(gate: Gate) -> Consequence:
    """What force-reopening this gate does (the Gates page's dialog), from the gate alone."""
    where = f"{gate.source.name}/{gate.namespace}"
    verified = len(gate.verified_instances or [])
    refresh = gate.active_refresh_id
    return Consequence(
        "force_reopen_gate",
        f"Force-reopen {where} without verification?",
        f"Force-reopen {gate.namespace}",
        "whatever each live worker reports (read back first), not verified"
        + (f"; last verified: {gate.verified_version}" if gate.verified_version else ""),
        [gate.namespace],
        f"every live worker of {gate.namespace} ({verified} verified, "
        f"{gate.unverified_count} unverified now)",
        f"{where}: {gate.get_state_display()}" + (f" — {gate.reason}" if gate.reason else ""),
        "nothing until you confirm",
        f"/api/v1/gates says {gate.namespace} is open (forced) by you, with your reason; "
        "rollouts are admitted at the versions the workers report"
        + (
            f"; policy refresh #{refresh} lets go of {gate.namespace} and resumes its engines there"
            if refresh
            else ""
        ),
        f"{gate.pk}",
    )
