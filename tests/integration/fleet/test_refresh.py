"""Discovery refreshes against a simulated fleet: membership, diff, errors, staleness."""

from __future__ import annotations

from django.utils import timezone

from controlplane.audit.models import AuditEvent
from controlplane.fleet.discovery import run_discovery
from controlplane.fleet.models import (
    DiscoveryRun,
    DiscoveryTrigger,
    Liveness,
    Source,
    Worker,
    WorkerEvent,
    WorkerState,
)
from controlplane.simfleet import Fault, WorkerSpec
from tests.integration.fleet.conftest import closed_port_url

MANUAL = DiscoveryTrigger.MANUAL


def _workers(source, **filters):
    return {w.key: w for w in Worker.objects.filter(source=source, **filters)}


def test_refresh_discovers_workers_across_prefix_namespaces(simfleet, make_source):
    source = make_source(simfleet)
    simfleet.add_worker(WorkerSpec(namespace="rlx", version="v0"))  # `rl` prefix must skip it

    run = run_discovery(source.pk, trigger=MANUAL)

    assert run.ok and run.error == ""
    assert run.reported_namespace == "rl"
    workers = _workers(source)
    expected = {
        f"{w['namespace']}/{w['component']}/rl/{w['instance_id']}"
        for w in simfleet.workers()
        if w["namespace"] != "rlx"
    }
    assert set(workers) == expected
    assert {w.namespace for w in workers.values()} == {"rl-a", "rl-b"}
    assert run.workers_total == 4 and run.joined == 4
    for w in workers.values():
        assert w.state == WorkerState.LIVE
        assert w.family == "vllm"
        assert "get_weight_version" in w.routes
        assert w.version_probed_at is not None  # get_weight_version answered
        assert w.liveness == Liveness.ALIVE
        assert int(w.instance_id) >= 0
    assert WorkerEvent.objects.filter(source=source, kind="joined").count() == 4
    audit = AuditEvent.objects.get(action="discovery.membership_changed")
    assert audit.details["joined"]["count"] == 4


def test_instance_ids_above_2_63_are_kept_exactly(simfleet_factory, make_source):
    big = 2**64 - 3
    fleet = simfleet_factory(workers=0, namespaces=["rl-a"], prefix="rl")
    fleet.add_worker(WorkerSpec(namespace="rl-a", instance_id=big))
    source = make_source(fleet)
    run_discovery(source.pk, trigger=MANUAL)
    (worker,) = Worker.objects.filter(source=source)
    assert worker.instance_id == str(big)


def test_churn_produces_the_right_diff_and_audit(simfleet, make_source):
    source = make_source(simfleet)
    run_discovery(source.pk, trigger=MANUAL)
    first, second, *_ = simfleet.workers()
    simfleet.remove_worker(first["instance_id"])
    new_key = simfleet.add_worker(WorkerSpec(namespace="rl-b"))
    simfleet.set_version(second["instance_id"], "v7")

    run = run_discovery(source.pk, trigger=MANUAL)

    assert (run.joined, run.left) == (1, 1)
    gone = Worker.objects.get(source=source, instance_id=str(first["instance_id"]))
    assert gone.state == WorkerState.GONE and gone.gone_at is not None  # marked, not deleted
    kinds = {(e.worker.instance_id, e.kind) for e in WorkerEvent.objects.filter(run=run)}
    assert (str(first["instance_id"]), "left") in kinds
    assert any(k == "joined" for _, k in kinds)
    version_event = WorkerEvent.objects.get(run=run, kind="version_changed")
    assert version_event.worker.instance_id == str(second["instance_id"])
    assert version_event.details == {"from": None, "to": "v7"}
    audit = AuditEvent.objects.filter(action="discovery.membership_changed").latest("sequence")
    assert audit.details["left"]["count"] == 1 and audit.details["joined"]["count"] == 1
    assert audit.details["run_id"] == run.pk
    assert new_key
    # Staying and joining workers alike carry this refresh's stamps; the one that left keeps
    # the time it was last seen.
    present = Worker.objects.filter(source=source).exclude(state=WorkerState.GONE)
    stamps = {(w.last_seen_at, w.last_probed_at, w.version_probed_at) for w in present}
    assert len(stamps) == 1 and len(set(next(iter(stamps)))) == 1, stamps
    assert gone.last_seen_at < next(iter(stamps))[0]


def test_unchanged_fleet_writes_no_events_and_no_audit(simfleet, make_source):
    source = make_source(simfleet)
    run_discovery(source.pk, trigger=MANUAL)
    audits = AuditEvent.objects.count()
    run = run_discovery(source.pk, trigger=MANUAL)
    assert run.ok and (run.joined, run.left, run.changed) == (0, 0, 0)
    assert not WorkerEvent.objects.filter(run=run).exists()
    assert AuditEvent.objects.count() == audits


def test_probe_error_shows_the_worker_erroring_and_recovers(simfleet, make_source):
    source = make_source(simfleet)
    run_discovery(source.pk, trigger=MANUAL)
    victim = simfleet.workers()[0]["instance_id"]
    simfleet.inject(victim, "probe", Fault(kind="probe_error", message="engine is dead"))

    run = run_discovery(source.pk, trigger=MANUAL)
    worker = Worker.objects.get(source=source, instance_id=str(victim))
    assert worker.state == WorkerState.ERRORING
    assert worker.error == "engine is dead"
    assert run.workers_erroring == 1
    assert WorkerEvent.objects.filter(run=run, kind="started_erroring", worker=worker).exists()

    simfleet.clear_faults(victim)
    run = run_discovery(source.pk, trigger=MANUAL)
    worker.refresh_from_db()
    assert worker.state == WorkerState.LIVE and worker.error == ""
    assert WorkerEvent.objects.filter(run=run, kind="stopped_erroring", worker=worker).exists()


def test_failing_version_probe_is_shown_and_keeps_last_known_version(simfleet, make_source):
    source = make_source(simfleet)
    victim = simfleet.workers()[0]["instance_id"]
    simfleet.set_version(victim, "v1")
    run_discovery(source.pk, trigger=MANUAL)
    read_at = Worker.objects.get(source=source, instance_id=str(victim)).version_probed_at
    simfleet.inject(victim, "get_weight_version", Fault(kind="http_error", status=500))

    run_discovery(source.pk, trigger=MANUAL)
    worker = Worker.objects.get(source=source, instance_id=str(victim))
    assert worker.version_error.startswith("HTTP 500")
    assert worker.weight_version == "v1"
    # The last time the version was read stays; the worker was still seen and probed now.
    assert worker.version_probed_at == read_at
    assert worker.last_seen_at > read_at and worker.last_probed_at > read_at
    others = Worker.objects.filter(source=source).exclude(pk=worker.pk)
    assert all(w.version_probed_at > read_at for w in others)

    simfleet.clear_faults(victim)
    run_discovery(source.pk, trigger=MANUAL)
    worker.refresh_from_db()
    assert worker.version_error == "" and worker.version_probed_at > read_at


def test_system_url_outside_allowed_networks_is_erroring_and_never_called(simfleet, make_source):
    source = make_source(simfleet)
    victim = simfleet.workers()[0]["instance_id"]
    # The worker advertises the cloud metadata address as its admin URL.
    descriptor = {"routes": ["get_weight_version"], "system_url": "http://169.254.169.254/w"}
    simfleet.inject(victim, "probe", Fault(kind="body", body=descriptor))

    run_discovery(source.pk, trigger=MANUAL)

    worker = Worker.objects.get(source=source, instance_id=str(victim))
    assert worker.state == WorkerState.ERRORING
    assert worker.error.startswith("system_url outside allowed networks: ")
    assert "169.254.169.254" in worker.error
    # Never called: no version was read and liveness was never probed.
    assert worker.version_probed_at is None and worker.version_error == ""
    assert worker.liveness == Liveness.UNKNOWN


def test_listener_outage_marks_stale_keeps_workers_and_recovery_clears(simfleet, make_source):
    source = make_source(simfleet)
    run_discovery(source.pk, trigger=MANUAL)
    good_url = source.listener_url
    Source.objects.filter(pk=source.pk).update(listener_url=closed_port_url())

    run = run_discovery(source.pk, trigger=MANUAL)  # must not raise
    source.refresh_from_db()
    assert not run.ok and "listener unreachable" in run.error
    assert source.stale and source.stale_reason == run.error
    assert Worker.objects.filter(source=source, state=WorkerState.LIVE).count() == 4
    went = AuditEvent.objects.get(action="source.went_stale")
    assert went.details["reason"] == run.error
    run_discovery(source.pk, trigger=MANUAL)  # still down: no second went_stale
    assert AuditEvent.objects.filter(action="source.went_stale").count() == 1

    Source.objects.filter(pk=source.pk).update(listener_url=good_url)
    run = run_discovery(source.pk, trigger=MANUAL)
    source.refresh_from_db()
    assert run.ok and not source.stale and source.stale_reason == ""
    assert AuditEvent.objects.filter(action="source.recovered").count() == 1


def test_garbage_from_the_listener_marks_stale(simfleet, make_source):
    # The frontend port answers 404 for /v1/rl/workers: not a listener.
    source = make_source(simfleet)
    Source.objects.filter(pk=source.pk).update(listener_url=simfleet.frontend_url)
    run = run_discovery(source.pk, trigger=MANUAL)
    source.refresh_from_db()
    assert not run.ok and source.stale
    assert "HTTP 404" in run.error


def test_a_claimed_source_is_not_refreshed_twice(simfleet, make_source):
    source = make_source(simfleet)
    future = timezone.now() + timezone.timedelta(seconds=60)
    Source.objects.filter(pk=source.pk).update(discovery_claimed_until=future)
    assert run_discovery(source.pk, trigger=MANUAL) is None
    assert not DiscoveryRun.objects.exists()


def test_a_scheduled_refresh_that_is_not_due_does_nothing(simfleet, make_source):
    source = make_source(simfleet, discovery_interval_seconds=60)
    assert run_discovery(source.pk, trigger=DiscoveryTrigger.SCHEDULE) is not None
    assert run_discovery(source.pk, trigger=DiscoveryTrigger.SCHEDULE) is None
    assert DiscoveryRun.objects.count() == 1
    source.refresh_from_db()
    assert source.discovery_claimed_until is None  # released after the run


def test_static_worker_is_probed_with_its_family_and_marked_static(simfleet, make_source):
    from controlplane.audit.recorder import Actor
    from controlplane.fleet import services

    source = make_source(simfleet)
    template = simfleet.state(simfleet.workers()[0]["instance_id"])
    services.add_static_worker(
        source,
        actor=Actor.system("test"),
        name="pinned",
        namespace="rl-static",
        system_url=template["system_url"],
        family="vllm",
        allowed_routes=["get_weight_version", "liveness_probe"],
    )
    run_discovery(source.pk, trigger=MANUAL)
    static = Worker.objects.get(source=source, static_worker__name="pinned")
    assert static.is_static and static.state == WorkerState.LIVE
    assert static.version_probed_at is not None and static.liveness == Liveness.ALIVE
    # Nothing in rl-static is registered at the frontend: no id is invented for it.
    assert static.instance_id == "" and static.endpoint == "static:pinned"
    assert static.identity_note == (
        "identity unknown: the frontend lists no instance of rl-static/backend/generate"
    )
