"""The update step of a distributed refresh: barrier → join → handshake → apply → destroy.

0. **Barrier.** The listener is read once more: every worker must still advertise the
   `world_size` it had at plan time (the plan's rank map gave it that many ranks). A change is
   topology drift: the refresh holds before any rank joins, naming the worker and both values.
1. **Join.** Every rank's `init` call goes out at once — not through the fan-out bound — since
   a collective group forms only when all ranks have joined, and a worker whose join hangs past
   its `DYN_RL_INIT_WEIGHTS_TIMEOUT_S` watchdog kills itself.
2. **Handshake.** All joined: announce `group_ready` (notification, websocket event, long poll)
   and wait for the trainer's `broadcast_done`, renewing the lease.
3. **Apply** the received weights on every worker (bounded fan-out) and read the version back.
4. **Destroy** the group on every rank, whatever happened in 3.

Any failure or timeout tears the group down (destroy on every rank that has a destroy route,
journaled) and holds the refresh: the workers stay paused, owned by the held refresh.
"""

from __future__ import annotations

from dataclasses import replace

from controlplane.refresh import handshake
from controlplane.refresh.executor.departures import read_listing
from controlplane.refresh.executor.journal import run_step_calls
from controlplane.refresh.executor.step_base import JobsStep, StepContext, StepResult
from controlplane.refresh.models import PlannedWorker
from controlplane.refresh.planning import GROUP_DESTROY, GROUP_INIT

#: Seconds past the watchdog to wait for a join's answer: a worker the watchdog killed then
#: shows as a dropped connection rather than our own timeout.
WATCHDOG_MARGIN_SECONDS = 5.0


def _named(outcomes, limit: int = 5) -> str:
    failed = [o for o in outcomes if o.status != "ok"]
    names = "; ".join(f"{o.key}: {o.error}" for o in failed[:limit])
    more = f" (+{len(failed) - limit} more)" if len(failed) > limit else ""
    return f"{len(failed)} of {len(outcomes)} workers — {names}{more}"


def tear_down(step: JobsStep, ctx: StepContext, workers: list[PlannedWorker], why: str) -> str:
    """Destroy the group on every rank that can, record why; returns a note for the reason."""
    jobs = [step.job(ctx, w, GROUP_DESTROY) for w in workers if w.calls.get(GROUP_DESTROY)]
    failed = []
    if jobs:
        cfg = replace(ctx.cfg, concurrency=len(jobs))
        journal = run_step_calls(ctx.lease, GROUP_DESTROY, ctx.attempt, jobs, cfg)
        failed = [o for o in journal.outcomes if o.status != "ok"]
    note = f"group torn down on {len(jobs) - len(failed)} of {len(jobs)} ranks with a destroy route"
    if failed:
        note += f" (destroy failed: {_named(journal.outcomes)})"
    handshake.move(ctx.lease, ctx.refresh.pk, handshake.TORN_DOWN, reason=f"{why}; {note}")
    return note


def topology_drift(step: JobsStep, ctx: StepContext, workers: list[PlannedWorker]) -> str:
    """The update barrier's topology check: the problem, or "" when every worker still lists
    the `world_size` recorded in its plan. Fails closed when the listener cannot be read; a
    worker no longer listed is left to the join (and the membership checks)."""
    planned = [w for w in workers if w.world_size is not None]
    if not planned:
        return ""
    listed, error = read_listing(ctx, step.name)
    if error:
        return f"topology not checked at the update barrier: {error}"
    drifted = [
        f"{w.key} world_size {w.world_size} at plan, {listed[w.key].world_size or 'none'} now"
        for w in planned
        if w.key in listed and listed[w.key].world_size != w.world_size
    ]
    if not drifted:
        return ""
    more = f" (+{len(drifted) - 5} more)" if len(drifted) > 5 else ""
    return (
        f"topology drift at the update barrier: {'; '.join(drifted[:5])}{more}; the plan's "
        "rank map no longer fits, so no rank joined: plan the refresh again"
    )


def run_distributed_update(step: JobsStep, ctx: StepContext, workers: list[PlannedWorker]):
    refresh = ctx.refresh
    # 0. Barrier: the topology the rank map was planned for.
    drift = topology_drift(step, ctx, workers)
    if drift:
        return StepResult(False, drift)
    target = refresh.target
    init_timeout = float(target.get("init_timeout_s", 30.0))
    broadcast_timeout = float(target.get("broadcast_timeout_s", 600.0))

    # 1. Join: all ranks at once, each answer awaited just past the workers' watchdog.
    # Each formation is a new handshake attempt: a broadcast_done for an earlier one is refused.
    handshake.begin_attempt(ctx.lease, refresh.pk)
    joins = [step.job(ctx, w, GROUP_INIT) for w in workers]
    cfg = replace(
        ctx.cfg, concurrency=max(1, len(joins)), timeout=init_timeout + WATCHDOG_MARGIN_SECONDS
    )
    journal = run_step_calls(ctx.lease, GROUP_INIT, ctx.attempt, joins, cfg)
    if journal.aborted:
        tear_down(step, ctx, workers, "aborted while joining")
        return StepResult(False, "aborted", aborted=True)
    if any(o.status != "ok" for o in journal.outcomes):
        why = f"the group did not form: join failed on {_named(journal.outcomes)}"
        note = tear_down(step, ctx, workers, why)
        return StepResult(False, f"{why}; {note}")

    # 2. Handshake: tell the trainer, wait for its broadcast.
    handshake.announce_ready(ctx.lease, refresh.pk, len(joins))
    answer = handshake.wait_for_broadcast(ctx.lease, refresh.pk, broadcast_timeout)
    if answer == "aborted":
        tear_down(step, ctx, workers, "aborted while waiting for the trainer's broadcast")
        return StepResult(False, "aborted", aborted=True)
    if answer == "timeout":
        why = f"the trainer did not report broadcast_done within {broadcast_timeout:g} s"
        note = tear_down(step, ctx, workers, why)
        return StepResult(False, f"{why}; {note}")

    # 3. Apply and read the version back (bounded fan-out), then 4. destroy on every rank.
    handshake.move(ctx.lease, refresh.pk, handshake.APPLYING)
    applies = [step.job(ctx, w) for w in workers]
    for job in applies:
        job.expect_version = refresh.weight_version
    applied = run_step_calls(ctx.lease, step.name, ctx.attempt, applies, ctx.cfg)
    judged = step.judge(applied, len(applies))
    result = StepResult(judged.ok, judged.reason, judged.detail, judged.aborted)
    if not result.ok or result.aborted:
        why = result.reason or "aborted while applying"
        note = tear_down(step, ctx, workers, why)
        if result.aborted:
            return result
        return StepResult(False, f"{why}; {note}")
    destroys = [step.job(ctx, w, GROUP_DESTROY) for w in workers if w.calls.get(GROUP_DESTROY)]
    every_rank = replace(ctx.cfg, concurrency=max(1, len(destroys)))
    destroyed = run_step_calls(ctx.lease, GROUP_DESTROY, ctx.attempt, destroys, every_rank)
    if any(o.status != "ok" for o in destroyed.outcomes):
        why = f"destroying the group failed on {_named(destroyed.outcomes)}"
        handshake.move(ctx.lease, refresh.pk, handshake.TORN_DOWN, reason=why)
        return StepResult(False, why)
    handshake.move(ctx.lease, refresh.pk, handshake.DESTROYED, destroyed_at=handshake.now_iso())
    return StepResult(
        True,
        detail=f"{len(workers)} workers joined a {refresh.group.get('world_size')}-rank group, "
        f"applied the broadcast and destroyed the group",
    )
