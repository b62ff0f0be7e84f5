"""A policy refresh's status for the terminal: one dict (the `--json` answer), its text, a
progress bar, and `watch`, which polls it until the refresh stops.

Watching polls the database rather than subscribing to the channel layer: the journal and the
refresh row are the truth (the Redis layer may drop messages; the browser resyncs from the
database for the same reason), a poll needs no async loop or channels Redis in a script, and
a few indexed queries a second cost nothing next to the refresh itself.

The refresh's own keys are the API's (`GET /api/v1/refreshes/{id}`, `RefreshOut`), so a
script reads the same names from either.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from django.utils import timezone

from controlplane.accounts.management.commands._cli import Exit, shown
from controlplane.intake.api.refreshes import RefreshOut, eta_out, serialize_refresh
from controlplane.refresh.models import (
    TERMINAL_STATES,
    PlannedWorker,
    PolicyRefresh,
    RefreshState,
    WorkerStepResult,
)
from controlplane.refresh.presenters import current_step, namespace_gates, step_lines
from controlplane.refresh.step_order import ORDER, WORKER_STEPS

#: States a watch stops at: the terminal ones, and held (it waits for a person).
STOP_STATES = TERMINAL_STATES | {RefreshState.HELD}
#: A step (or a worker's step) that needs nothing more.
DONE = frozenset({"ok", "skipped"})
BAR_WIDTH = 24


def outcome_exit(state: str) -> Exit | None:
    """The exit code a watch ends with in `state`; None while it goes on."""
    if state == RefreshState.SUCCEEDED:
        return Exit.OK
    if state in STOP_STATES:
        return Exit.FAILED
    return None


def _latest_results(refresh: PolicyRefresh) -> dict[tuple[int, str], str]:
    latest: dict[tuple[int, str], str] = {}
    for worker_id, step, status in (
        WorkerStepResult.objects.filter(refresh=refresh)
        .order_by("id")
        .values_list("planned_worker_id", "step", "status")
    ):
        latest[(worker_id, step)] = status
    return latest


def status_of(refresh_id: int) -> dict[str, Any]:
    """Everything `status` prints, from the database (the `--json` answer; its keys are in
    docs/operate/refresh-cli.md)."""
    refresh = PolicyRefresh.objects.select_related("source", "approved_by").get(pk=refresh_id)
    workers = dict(PlannedWorker.objects.filter(refresh=refresh).values_list("pk", "namespace"))
    latest = _latest_results(refresh)
    steps = step_lines(refresh)
    phase = current_step(refresh)

    by_step = {}
    for step in WORKER_STEPS:
        counts = Counter(latest.get((pk, step.value), "pending") for pk in workers)
        by_step[step.value] = dict(sorted(counts.items()))
    failed = Counter(
        workers[pk] for (pk, _), status in latest.items() if status == "failed" and pk in workers
    )
    namespace_workers = Counter(workers.values())
    namespaces = [
        {
            "namespace": row.namespace,
            "gate_state": row.state,
            "gate": row.text,
            "held_here": row.held_here,
            "outcome": row.outcome,
            "workers": namespace_workers.get(row.namespace, 0),
            "failed_workers": failed.get(row.namespace, 0),
        }
        for row in namespace_gates(refresh)
    ]

    steps_done = sum(1 for line in steps if line.name in ORDER and line.status in DONE)
    workers_done = workers_total = 0
    if phase in by_step:
        workers_total = len(workers)
        workers_done = sum(n for status, n in by_step[phase].items() if status in DONE)
    fraction = 1.0 if refresh.state == RefreshState.SUCCEEDED else 0.0
    if not fraction and ORDER:
        within = workers_done / workers_total if workers_total else 0.0
        fraction = min(1.0, (steps_done + within) / len(ORDER))
    ended = refresh.finished_at or timezone.now()
    return {
        "refresh": RefreshOut.model_validate(serialize_refresh(refresh)).model_dump(mode="json"),
        "state": refresh.state,
        "phase": phase,
        "stopped": refresh.state in STOP_STATES,
        "elapsed_seconds": (
            round((ended - refresh.started_at).total_seconds(), 1) if refresh.started_at else None
        ),
        "progress": {
            "steps_done": steps_done,
            "steps_total": len(ORDER),
            "workers_done": workers_done,
            "workers_total": workers_total,
            "fraction": round(fraction, 3),
        },
        "steps": [
            {
                "name": line.name,
                "label": line.label,
                "status": line.status,
                "attempts": line.attempts,
                "duration_ms": line.ms,
                "detail": line.detail,
            }
            for line in steps
        ],
        "workers": {"total": len(workers), "by_step": by_step},
        "namespaces": namespaces,
        "eta": eta_out(refresh),
    }


def progress_bar(fraction: float, width: int = BAR_WIDTH) -> str:
    filled = round(max(0.0, min(1.0, fraction)) * width)
    return "[" + "#" * filled + "-" * (width - filled) + f"] {fraction * 100:3.0f}%"


def progress_line(status: dict[str, Any]) -> str:
    """One line: state, bar, and where the current step is."""
    refresh, progress = status["refresh"], status["progress"]
    line = f"#{refresh['id']} {status['state']:<17} {progress_bar(progress['fraction'])}"
    line += f"  step {progress['steps_done']}/{progress['steps_total']}"
    if status["phase"]:
        line += f" {status['phase']}"
        if progress["workers_total"]:
            line += f" {progress['workers_done']}/{progress['workers_total']} workers"
    elif status["state"] == RefreshState.HELD and refresh["failed_step"]:
        line += f", held at {refresh['failed_step']}"
    elif status["state"] == RefreshState.WAITING:
        line += f", waiting after wave {refresh['wave']} of {refresh['waves']} until continued"
    elif status["state"] == RefreshState.CANARY_REVIEW:
        canary = refresh.get("canary") or {}
        line += (
            f", canary awaits a {canary.get('evaluation', '?')} verdict until "
            f"{canary.get('deadline', '?')}"
        )
    elif status["state"] == RefreshState.AWAITING_APPLY:
        external = refresh.get("external") or {}
        line += (
            f", waits for the trainer's applied report from {len(external.get('missing') or [])}"
            f" of {len(external.get('workers') or [])} workers until "
            f"{external.get('deadline', '?')}"
        )
    return line


def _workers(n: int) -> str:
    return f"{n} worker{'' if n == 1 else 's'}"


def status_text(status: dict[str, Any]) -> str:
    r = status["refresh"]
    target = r["target"]
    lines = [
        f"policy refresh #{r['id']}: {r['source']} {', '.join(shown(n) for n in r['namespaces'])}"
        f" -> {shown(target.get('weight_version'))} ({shown(target.get('method', '?'))})",
        f"state: {status['state']}" + (f" (step {status['phase']})" if status["phase"] else ""),
        f"strategy: {shown(r['strategy'].get('description', ''))}"
        + (f" (wave {r['wave']} of {r['waves']})" if r["waves"] > 1 else ""),
        progress_line(status),
        f"requested by {shown(r['requested_by'])} at {r['created_at']}"
        + (f", approved by {shown(r['approved_by'])}" if r["approved_by"] else ""),
    ]
    if r["started_at"]:
        lines.append(
            f"started {r['started_at']}"
            + (f", finished {r['finished_at']}" if r["finished_at"] else "")
            + f", elapsed {status['elapsed_seconds']} s"
        )
    eta = status["eta"]
    if eta["estimated_end"]:
        lines.append(
            f"estimated end: {eta['estimated_end']} (about {eta['remaining_seconds']} s left; "
            f"{eta['basis']})"
        )
    elif not status["stopped"]:
        lines.append(f"estimated end: unknown ({eta['reason']})")
    for label, key in (("held", "held_reason"), ("ended", "end_reason")):
        if r[key]:
            lines.append(f"{label}: {shown(r[key])}")
    lines += [f"blocker: {shown(b)}" for b in r["plan_blockers"]]
    lines.append("steps:")
    for step in status["steps"]:
        ms = f"{step['duration_ms']:8.0f} ms" if step["duration_ms"] is not None else " " * 11
        tries = f" x{step['attempts']}" if step["attempts"] > 1 else ""
        detail = shown(step["detail"])[:120]
        lines.append(f"  {step['label']:<26} {step['status'] + tries:<10} {ms}  {detail}".rstrip())
    workers = status["workers"]
    lines.append(f"workers: {workers['total']}")  # then per worker step: status count, ...
    for step, counts in workers["by_step"].items():
        text = ", ".join(f"{status} {n}" for status, n in counts.items()) or "-"
        lines.append(f"  {step:<15} {text}")
    lines.append("namespaces:")
    for ns in status["namespaces"]:
        outcome = f" [{ns['outcome'].replace('_', '-')}]" if ns["outcome"] else ""
        failed = f", {ns['failed_workers']} failed" if ns["failed_workers"] else ""
        # A gate this refresh holds says why in the refresh's own reason, printed above.
        gate = f"{ns['gate_state']}, held by this refresh" if ns["held_here"] else ns["gate"]
        lines.append(
            f"  {shown(ns['namespace'])}: {_workers(ns['workers'])}{failed}; "
            f"gate {shown(gate)}{outcome}"
        )
    return "\n".join(lines)


def watch(
    refresh_id: int,
    *,
    interval: float,
    timeout: float | None,
    on_change: Callable[[dict[str, Any]], None],
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[dict[str, Any], Exit]:
    """Poll until the refresh stops (terminal or held) or `timeout` runs out; call
    `on_change` with each status whose progress line or step list differs from the last."""
    deadline = None if timeout is None else time.monotonic() + timeout
    last: tuple | None = None
    while True:
        status = status_of(refresh_id)
        seen = (progress_line(status), tuple((s["name"], s["status"]) for s in status["steps"]))
        if seen != last:
            on_change(status)
            last = seen
        outcome = outcome_exit(status["state"])
        if outcome is not None:
            return status, outcome
        if deadline is not None and time.monotonic() >= deadline:
            return status, Exit.TIMED_OUT
        sleep(interval)
