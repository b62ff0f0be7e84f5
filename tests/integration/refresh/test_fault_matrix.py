"""Every fault the simulated fleet can inject, at every worker step: the refresh ends held or
finished, and from held the operator's actions always reach a terminal state with the scope
free, no worker left paused unless the refresh names it, and a new refresh of the scope runs.

Each fault is armed just before its step starts (the executor stops after the previous step and
hands its lease over cleanly) and stays armed — the worst case — while the operator recovers:
retry (twice), then one way of closing out, rotated over abort-with-resume, force-reopen and
end (every closing way is tried on the crashed-worker cases). Only then is the fleet repaired
and a new refresh of the same scope must start and succeed.
"""

from __future__ import annotations

from collections import Counter

import pytest

from controlplane.audit.models import AuditEvent
from controlplane.refresh import intents
from controlplane.refresh.executor import execute_refresh
from controlplane.refresh.models import (
    TERMINAL_STATES,
    Gate,
    PolicyRefresh,
    RefreshState,
    ScopeLock,
)
from controlplane.refresh.namespaces import verified_namespaces
from controlplane.simfleet import Fault, WorkerSpec
from tests.integration.refresh.helpers import (
    actor_for,
    fleet_config,
    fleet_versions,
    force_reopen_each,
    make_source,
    paused_workers,
    plan,
    run_inline,
)

pytestmark = pytest.mark.django_db

#: Worker steps, the step that runs before each, and the vLLM route each one calls.
STEPS = {
    "pause": ("resolve", "pause_generation"),
    "update": ("pause", "update_weights_from_disk"),
    "flush": ("update", "flush_cache"),
    "resume": ("flush", "resume_generation"),
    "verify": ("resume_engines", "get_weight_version"),
}
GARBAGE = ["not", "an", "object"]


def admin_faults() -> dict[str, Fault | None]:
    return {
        "latency": Fault.latency(0.05),
        "hang": Fault.hang(),  # past the call timeout; the worker answers after the test
        "error_body": Fault.error("injected engine error"),
        "http_error": Fault.http(500, "injected handler error"),
        "drop": Fault.drop(),
        "crash": Fault.crash(),  # the process dies mid-call and leaves the fleet
        "missing": Fault.missing(),
        "body": Fault.reply(GARBAGE),
        "revert_version": Fault.revert_version(once=False),
    }


def generate_faults() -> dict[str, Fault]:
    return {
        "latency": Fault.latency(0.05),
        "hang": Fault.hang(),
        "cancel": Fault.cancel(),
        "wrong_tokens": Fault.wrong_tokens(),
        "http_error": Fault.http(500, "injected generation error"),
        "error_body": Fault.error("injected generation error"),
        "drop": Fault.drop(),
        "crash": Fault.crash(),
    }


def probe_faults() -> dict[str, Fault]:
    return {
        "latency": Fault.latency(0.05),
        # Past the listener's per-worker deadline (2 s here): the listener names the worker
        # `timed out after 2s`; the executor's read waits past that deadline.
        "hang": Fault.hang(),
        "probe_error": Fault.probe_error("engine is dead"),
        "body": Fault.reply(GARBAGE),
        "http_error": Fault.http(500, "probe failed"),
        "drop": Fault.drop(),
        "missing": Fault.missing(),
        "crash": Fault.crash(),
    }


#: force_reopen forces every held namespace open one by one (each resumes its own engines);
#: namespace_by_namespace reopens the verified namespaces, then forces the rest.
CLOSERS = ("abort_with_resume", "force_reopen", "end", "namespace_by_namespace")


def cases():
    found = []
    for step in STEPS:
        for kind in admin_faults():
            closers = CLOSERS if kind == "crash" else (None,)
            found += [(f"{step}:{kind}", step, "admin", kind, closer) for closer in closers]
        for churn in ("leave", "join"):
            found.append((f"{step}:{churn}", step, "churn", churn, None))
    for kind in generate_faults():
        closers = CLOSERS if kind == "crash" else (None,)
        found += [(f"verify:generate-{kind}", "verify", "generate", kind, c) for c in closers]
    for kind in probe_faults():
        found.append((f"pause:probe-{kind}", "pause", "probe", kind, None))
    # Rotate the closing way over the cases that do not name one.
    return [
        pytest.param(
            step, where, kind, closer or CLOSERS[i % len(CLOSERS)], id=f"{name}-{closer or 'r'}"
        )
        for i, (name, step, where, kind, closer) in enumerate(found)
    ]


TALLY: Counter = Counter()


@pytest.fixture(scope="module", autouse=True)
def summary(request):
    yield
    if TALLY["tried"]:
        line = (
            f"fault matrix: {TALLY['tried']} faults x steps tried, "
            f"{TALLY['recoverable']} recoverable to an unlocked scope; first run "
            f"{TALLY['first:held']} held, {TALLY['first:succeeded']} finished; "
            f"held ones ended by retry {TALLY['by:retry']}, resolve-membership "
            f"{TALLY['by:resolve_membership']}, abort-with-resume "
            f"{TALLY['by:abort_with_resume']}, force-reopen {TALLY['by:force_reopen']}, "
            f"namespace by namespace {TALLY['by:namespace_by_namespace']} "
            f"({TALLY['reopened_verified']} reopening verified namespaces first), "
            f"end {TALLY['by:end']}; {TALLY['paused_named']} with engines left paused "
            "and named by the refresh"
        )
        # Printed past output capture, so the figure shows in every run (CI included).
        capture = request.config.pluginmanager.get_plugin("capturemanager")
        with capture.global_and_fixture_disabled():
            print("\n" + line)


@pytest.fixture(autouse=True)
def fast(settings):
    settings.REFRESH_CALL_TIMEOUT_SECONDS = 0.5


@pytest.fixture
def fleet(simfleet_factory):
    return simfleet_factory(fleet_config(3))


@pytest.fixture
def source(fleet):
    return make_source(fleet)


def run(refresh, **kwargs):
    execute_refresh(refresh.pk, **kwargs)
    refresh.refresh_from_db()
    return refresh


def arm(fleet, victim, step, where, kind):
    if where == "admin":
        fleet.inject(victim, STEPS[step][1], admin_faults()[kind])
    elif where == "generate":
        fleet.inject(victim, "generate", generate_faults()[kind])
    elif where == "probe":
        fleet.inject(victim, "probe", probe_faults()[kind])
    elif kind == "leave":
        fleet.remove_worker(victim)
    else:
        fleet.add_worker(WorkerSpec(namespace="rl-a"))


def run_to_step(refresh, step):
    """Stop after the step before `step`, then hand the lease over cleanly (no takeover)."""
    before = STEPS[step][0]
    assert run(refresh, stop_after=before).state != RefreshState.HELD, refresh.held_reason
    PolicyRefresh.objects.filter(pk=refresh.pk).update(lease_owner="", lease_expires_at=None)


def close_out(refresh, closer, operator, approver):
    if closer == "abort_with_resume":
        intents.abort_policy_refresh(refresh, actor=actor_for(operator), resume_engines=True)
        return run(refresh)
    if closer == "force_reopen":
        return force_reopen_each(refresh, approver, reason="fault matrix")
    if closer == "namespace_by_namespace":
        if verified_namespaces(refresh):
            refresh = intents.reopen_verified_namespaces(refresh, actor=actor_for(operator))
            TALLY["reopened_verified"] += 1
        if refresh.state == RefreshState.HELD:
            refresh = force_reopen_each(refresh, approver, reason="fault matrix")
        return refresh
    intents.end_policy_refresh(refresh, actor=actor_for(approver), reason="fault matrix")
    refresh.refresh_from_db()
    return refresh


def named_as_left_paused(refresh) -> set[str]:
    """Workers the terminal refresh itself says it left paused (audit of its ending)."""
    named: set[str] = set()
    for details in AuditEvent.objects.filter(correlation_id=refresh.correlation_id).values_list(
        "details", flat=True
    ):
        named |= set(details.get("left_paused") or [])
        named |= {entry["worker"] for entry in details.get("not_resumed") or []}
    return named


@pytest.mark.parametrize(("step", "where", "kind", "closer"), cases())
def test_every_fault_is_recoverable_to_an_unlocked_scope(
    fleet, source, operator, approver, settings, step, where, kind, closer
):
    TALLY["tried"] += 1
    victim = next(w["key"] for w in fleet.workers() if w["namespace"] == "rl-a")
    refresh = plan(source, operator, "v2", flush_policy="always")
    assert not refresh.plan_blockers, refresh.plan_blockers
    intents.start_policy_refresh(refresh, actor=actor_for(operator), enqueue=False)
    run_to_step(refresh, step)
    arm(fleet, victim, step, where, kind)

    refresh = run(refresh)
    assert refresh.state in (RefreshState.HELD, RefreshState.SUCCEEDED), refresh.state
    first = refresh.state
    TALLY[f"first:{first}"] += 1

    ended_by = "retry"
    for _ in range(2):
        if refresh.state != RefreshState.HELD:
            break
        intents.retry_policy_refresh(refresh, actor=actor_for(operator))
        refresh = run(refresh)
    if intents.is_membership_hold(refresh):
        # The default rule held on who left or joined: one action resolves it.
        intents.resolve_membership(refresh, actor=actor_for(operator))
        refresh = run(refresh)
        ended_by = "resolve_membership"
    if refresh.state == RefreshState.HELD:
        ended_by = closer
        refresh = close_out(refresh, closer, operator, approver)
    assert refresh.state in TERMINAL_STATES, (refresh.state, refresh.held_reason)
    if first == RefreshState.HELD:
        TALLY[f"by:{ended_by}"] += 1

    # The scope is free and no gate names the refresh.
    assert not ScopeLock.objects.filter(source=source).exists()
    assert not Gate.objects.filter(active_refresh=refresh).exists()
    # No gate is stranded: each admits, or is closed with a reason and force-reopen opens it.
    for gate in Gate.objects.filter(source=source, state="closed"):
        assert gate.reason, gate
    # Every engine still paused is one the refresh itself names as left paused.
    identity = {w["key"]: w["identity"] for w in fleet.workers()}
    still_paused = {identity[k] for k in paused_workers(fleet)}
    assert still_paused <= named_as_left_paused(refresh), still_paused
    if still_paused:
        TALLY["paused_named"] += 1

    # Repaired, the same scope takes a new refresh, which leaves every engine running.
    fleet.clear_faults()
    settings.REFRESH_CALL_TIMEOUT_SECONDS = 10.0  # healthy workers on a busy machine
    later = run_inline(source, operator, "v3")
    assert later.state == RefreshState.SUCCEEDED, later.held_reason
    assert paused_workers(fleet) == []
    assert set(fleet_versions(fleet).values()) == {"v3"}
    TALLY["recoverable"] += 1


@pytest.mark.parametrize("step", ["pause", "reopen"])
def test_a_hung_probe_names_its_worker_and_never_holds_spuriously_or_forever(
    fleet, source, operator, step
):
    """The executor's admin-call timeout (0.5 s here) is far below the listener's per-worker
    deadline (2 s): its discovery reads must wait past that deadline, so one hung probe
    is a worker named in the listing, not a failed listener read that names nobody."""
    victim = next(w for w in fleet.workers() if w["namespace"] == "rl-a")
    refresh = plan(source, operator, "v2")
    assert not refresh.plan_blockers, refresh.plan_blockers
    intents.start_policy_refresh(refresh, actor=actor_for(operator), enqueue=False)
    if step == "pause":  # armed before resolve reads the listener
        fleet.inject(victim["key"], "probe", Fault.hang())
        refresh = run(refresh)
    else:  # armed before reopen reads it again
        assert run(refresh, stop_after="verify").state != RefreshState.HELD, refresh.held_reason
        PolicyRefresh.objects.filter(pk=refresh.pk).update(lease_owner="", lease_expires_at=None)
        fleet.inject(victim["key"], "probe", Fault.hang())
        refresh = run(refresh)

    assert refresh.state == RefreshState.HELD
    reason = refresh.held_reason
    assert "discovery failed" not in reason and "listener timed out" not in reason, reason
    assert victim["identity"] in reason and "worker discovery timed out after 2s" in reason
    # The plan stays truthful: nothing was paused by a hold at resolve.
    if step == "pause":
        assert paused_workers(fleet) == []
    # Not endless: once the worker answers again, a retry goes on and finishes.
    fleet.clear_faults()
    intents.retry_policy_refresh(refresh, actor=actor_for(operator))
    refresh = run(refresh)
    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    assert paused_workers(fleet) == []
