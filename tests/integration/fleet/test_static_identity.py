"""Static workers under their real identity: the frontend's `/health` instances, re-read on
every discovery; refusals that name the worker; and the declared listener scope enforced."""

from __future__ import annotations

import pytest

from controlplane.audit.recorder import Actor
from controlplane.fleet import services
from controlplane.fleet.discovery.runner import run_discovery
from controlplane.fleet.models import DiscoveryTrigger, Worker, WorkerState
from controlplane.simfleet import FleetConfig, WorkerSpec

pytestmark = pytest.mark.django_db
MANUAL = DiscoveryTrigger.MANUAL
SYSTEM = Actor.system("test")
SGLANG_ROUTES = ["pause_generation", "continue_generation", "get_weight_version"]


def sglang(fleet, namespace="rl-a", component="sglang", **extra) -> str:
    return fleet.add_worker(
        WorkerSpec(namespace=namespace, component=component, family="sglang", **extra)
    )


def add_static(source, fleet, key, name="sgl-1", **kw):
    state = fleet.state(key)
    values = {
        "name": name,
        "namespace": state["namespace"],
        "component": state["component"],
        "system_url": state["system_url"],
        "family": "sglang",
        "allowed_routes": SGLANG_ROUTES,
        "model": state.get("model") or "",
    }
    return services.add_static_worker(source, actor=SYSTEM, **{**values, **kw})


def static_row(source, name="sgl-1") -> Worker:
    return Worker.objects.exclude(state=WorkerState.GONE).get(
        source=source, static_worker__name=name
    )


@pytest.fixture
def fleet(simfleet_factory):
    return simfleet_factory(FleetConfig(workers=[], listener_env={"DYN_NAMESPACE": "rl-a"}))


def test_a_static_worker_gets_the_instance_id_the_frontend_registered(fleet, make_source):
    key = sglang(fleet)
    source = make_source(fleet, expected_prefix="", expected_namespace="rl-a")
    add_static(source, fleet, key)
    run_discovery(source.pk, trigger=MANUAL)

    row = static_row(source)
    assert row.instance_id == str(fleet.state(key)["instance_id"])
    assert row.endpoint == "generate" and row.key.startswith("rl-a/sglang/generate/")
    assert row.state == WorkerState.LIVE and row.identity_note == ""


def test_a_restart_is_resolved_again_to_its_new_id(fleet, make_source):
    key = sglang(fleet)
    source = make_source(fleet, expected_prefix="", expected_namespace="rl-a")
    add_static(source, fleet, key)
    run_discovery(source.pk, trigger=MANUAL)
    before = static_row(source)

    # The process restarts on the same system port: a new runtime, a new instance id.
    fleet.remove_worker(key)
    sglang(fleet, token=key)  # a worker's key is its system server's token
    run_discovery(source.pk, trigger=MANUAL)

    after = static_row(source)
    assert after.instance_id == str(fleet.state(key)["instance_id"]) != before.instance_id
    before.refresh_from_db()
    assert before.state == WorkerState.GONE and before.static_worker_id is None


def test_replicas_on_one_host_are_refused_as_ambiguous_unless_declared(fleet, make_source):
    first, second = sglang(fleet), sglang(fleet)
    source = make_source(fleet, expected_prefix="", expected_namespace="rl-a")
    add_static(source, fleet, first, name="sgl-1")
    add_static(
        source,
        fleet,
        second,
        name="sgl-2",
        declared_instance_id=str(fleet.state(second)["instance_id"]),
    )
    run_discovery(source.pk, trigger=MANUAL)

    ambiguous = static_row(source, "sgl-1")
    assert ambiguous.state == WorkerState.ERRORING and ambiguous.instance_id == ""
    assert ambiguous.error.startswith(
        "static worker sgl-1: ambiguous identity, 2 instances of rl-a/sglang/generate match"
    )
    declared = static_row(source, "sgl-2")
    assert declared.state == WorkerState.LIVE
    assert declared.instance_id == str(fleet.state(second)["instance_id"])


def test_a_declared_id_the_frontend_does_not_list_is_refused(fleet, make_source):
    key = sglang(fleet)
    source = make_source(fleet, expected_prefix="", expected_namespace="rl-a")
    add_static(source, fleet, key, declared_instance_id="12345")
    run_discovery(source.pk, trigger=MANUAL)

    row = static_row(source)
    assert row.state == WorkerState.ERRORING and row.instance_id == ""
    assert row.error.startswith(
        "static worker sgl-1: declared instance id 12345 is not registered at the frontend "
        "as rl-a/sglang/generate"
    )


def test_a_static_worker_at_a_wrong_url_is_refused_by_name(fleet, make_source):
    from tests.integration.fleet.conftest import closed_port_url

    key = sglang(fleet)
    source = make_source(fleet, expected_prefix="", expected_namespace="rl-a")
    wrong = closed_port_url()
    add_static(source, fleet, key, system_url=wrong)
    run_discovery(source.pk, trigger=MANUAL)

    row = static_row(source)
    assert row.state == WorkerState.ERRORING
    assert row.error.startswith(f"static worker unreachable at {wrong}")


def test_workers_outside_the_declared_scope_are_refused_on_every_discovery(
    simfleet_factory, make_source
):
    fleet = simfleet_factory(
        FleetConfig.generate(workers=2, namespaces=("rl-a", "rl-b"), prefix="rl", seed=3)
    )
    source = make_source(fleet, listener_scope="exact", expected_namespace="rl-a")
    for _ in range(2):
        run_discovery(source.pk, trigger=MANUAL)
        rows = {w.namespace: w for w in Worker.objects.filter(source=source)}
        assert rows["rl-a"].state == WorkerState.LIVE
        assert rows["rl-b"].state == WorkerState.ERRORING
        assert rows["rl-b"].error.startswith(
            "outside the declared listener scope: namespace 'rl-b' is not matched by exact"
        )


def test_an_undeclared_global_listener_is_refused(simfleet_factory, make_source):
    fleet = simfleet_factory(
        FleetConfig.generate(
            workers=2,
            namespaces=("dynamo", "team-b"),
            listener_env={"DYN_NAMESPACE_PREFIX": "dynamo"},
            seed=3,
        )
    )
    source = make_source(fleet, expected_prefix="")
    run_discovery(source.pk, trigger=MANUAL)
    rows = {w.namespace: w for w in Worker.objects.filter(source=source)}
    assert rows["dynamo"].state == WorkerState.LIVE
    assert "does not declare a global scope" in rows["team-b"].error

    services.update_source(source, actor=SYSTEM, listener_scope="global")
    run_discovery(source.pk, trigger=MANUAL)
    assert Worker.objects.get(source=source, namespace="team-b").state == WorkerState.LIVE
