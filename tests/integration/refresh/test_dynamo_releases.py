"""Per-release contracts, used: a source declaring Dynamo 1.7 is driven with 1.7's route tables,
bodies and success rules (`dynamo.releases`), against a simulated fleet whose workers behave as
1.7 (`WorkerSpec.dynamo_release`), for vLLM and SGLang shapes; the compatibility record names
the release.
"""

from __future__ import annotations

import pytest

from controlplane.audit.recorder import Actor
from controlplane.fleet.models import Source
from controlplane.fleet.services import add_static_worker
from controlplane.refresh.models import JournalEntry, RefreshState
from controlplane.simfleet import FleetConfig, WorkerSpec
from tests.integration.refresh.helpers import (
    fleet_config,
    fleet_versions,
    make_source,
    plan,
    run_inline,
)
from tests.integration.refresh.test_update_methods import SGLANG_ALLOWLIST, sglang_fleet

pytestmark = pytest.mark.django_db


def _declare(source: Source, release: str) -> Source:
    source.dynamo_release = release
    source.save(update_fields=["dynamo_release"])
    return source


def vllm_17_fleet(simfleet_factory):
    """Four 1.7 vLLM Python workers; two are builds that track no declared version (no
    `set_weight_version`, a `get_weight_version` without `version_declared`)."""
    config = fleet_config(4, seed=3)
    for i, spec in enumerate(config.workers):
        spec.dynamo_release = "1.7"
        spec.version_tracking = i % 2 == 0
    return simfleet_factory(config)


def test_a_17_vllm_fleet_refreshes_under_the_17_contract(simfleet_factory, operator):
    fleet = vllm_17_fleet(simfleet_factory)
    source = _declare(make_source(fleet), "1.7")
    refresh = run_inline(source, operator, "v2")
    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    assert set(fleet_versions(fleet).values()) == {"v2"}
    # The readback's rule is the plan's: trusted where set_weight_version is advertised,
    # ignored where it is not (the reply then has no version_declared: "not tracked").
    rules = sorted(
        call["declared"]
        for w in refresh.workers.all()
        for call in w.calls["verify"]
        if call["operation"] == "get_weight_version"
    )
    assert rules == ["ignored", "ignored", "trusted", "trusted"]
    untracked = JournalEntry.objects.filter(
        refresh=refresh, step="verify", operation="get_weight_version", ok=True
    ).exclude(response_body__has_key="version_declared")
    assert untracked.count() == 2
    assert refresh.compat["dynamo_release"]["release"] == "1.7"
    assert refresh.compat["dynamo_release"]["from"] == "declared on the source"


def test_the_same_fleet_under_the_161_contract_fails_closed(simfleet_factory, operator):
    """1.6.1 answers version_declared on every reply: one without it is malformed."""
    fleet = vllm_17_fleet(simfleet_factory)
    source = make_source(fleet)  # release not declared: 1.6.1
    refresh = run_inline(source, operator, "v2")
    assert refresh.state == RefreshState.HELD
    assert refresh.failed_step == "verify"
    assert "lacks 'version'/'version_declared'" in refresh.held_reason
    assert refresh.compat["dynamo_release"]["release"] == "1.6.1"


def test_a_17_sglang_fleet_refreshes_with_the_documented_disk_update(simfleet_factory, operator):
    fleet, source = sglang_fleet(
        simfleet_factory, "get_weight_version", dynamo_release="1.7", paused_requests=1
    )
    _declare(source, "1.7")
    refresh = run_inline(source, operator, "v2")
    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    updates = JournalEntry.objects.filter(refresh=refresh, step="update")
    assert updates.count() == 2
    for update in updates:
        assert update.url.endswith("/engine/control/update_weights_from_disk")
        body = update.request_body
        # 1.7's documented disk update: the cache reset, the explicit abort, and keep_pause
        # (without it 1.7's SGLang would resume generation before our verify step).
        assert (body["flush_cache"], body["abort_all_requests"], body["keep_pause"]) == (
            True,
            True,
            True,
        )
    pauses = JournalEntry.objects.filter(refresh=refresh, step="pause")
    assert {p.url.rsplit("/engine/", 1)[1] for p in pauses} == {"pause_generation"}
    assert {w["version"] for w in fleet.workers()} == {"v2"}
    assert refresh.compat["dynamo_release"]["release"] == "1.7"


def test_under_the_161_contract_the_sglang_disk_update_has_no_keep_pause(
    simfleet_factory, operator
):
    """The body comes from the source's release: 1.6.1's disk update sends no keep_pause."""
    _fleet, source = sglang_fleet(simfleet_factory, "get_weight_version", dynamo_release="1.7")
    refresh = run_inline(source, operator, "v2")  # source left at 1.6.1
    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    update = JournalEntry.objects.filter(refresh=refresh, step="update").first()
    assert "keep_pause" not in update.request_body


def test_a_17_sglang_allowlist_naming_a_removed_route_is_refused(simfleet_factory, operator):
    fleet = simfleet_factory(FleetConfig(workers=[], listener_env={"DYN_NAMESPACE": "rl-a"}))
    source = _declare(make_source(fleet), "1.7")
    key = fleet.add_worker(
        WorkerSpec(
            namespace="rl-a",
            family="sglang",
            engine_routes=["get_weight_version"],
            dynamo_release="1.7",
            version="v1",
        )
    )
    add_static_worker(
        source,
        actor=Actor.system("test"),
        name="sgl-1",
        namespace="rl-a",
        system_url=fleet.state(key)["system_url"],
        family="sglang",
        allowed_routes=[
            *SGLANG_ALLOWLIST,
            "get_weight_version",
            "control/release_memory_occupation",
        ],
        model="sim-model",
        declared_instance_id=str(fleet.state(key)["instance_id"]),
    )
    refresh = plan(source, operator, "v2")
    (worker,) = refresh.workers.all()
    assert any(
        "control/release_memory_occupation no longer exist in Dynamo 1.7" in b
        for b in worker.blockers
    ), worker.blockers


def test_a_17_vllm_sidecar_generation_sends_no_extra_args(
    simfleet_factory, transactional_db, operator
):
    """A distributed refresh of 1.7 sidecars and Python workers, verified by a generation
    pinned to each: the 1.7 simulated sidecar refuses sampling_params.extra_args."""
    from django.test import Client

    from controlplane.accounts.tokens import create_token
    from tests.integration.refresh.helpers import execute_in_thread
    from tests.integration.refresh.test_distributed_update import (
        UPDATE,
        distributed,
        plan_and_start,
        wait_until_ready,
    )

    config = fleet_config(4, seed=5)
    for i, spec in enumerate(config.workers):
        spec.family = "vllm-sidecar" if i % 2 else "vllm"
        spec.world_size = 2 if i % 2 else 1
        spec.dynamo_release = "1.7"
    fleet = simfleet_factory(config)
    source = _declare(make_source(fleet), "1.7")
    target = distributed("v17", update={**UPDATE, "update_infos": [{"names": ["lm_head.weight"]}]})
    refresh = plan_and_start(source, operator, target)
    _, secret = create_token(user=operator, label="trainer", actor=Actor.system())
    client, auth = Client(), {"HTTP_AUTHORIZATION": f"Bearer {secret}"}
    thread, done = execute_in_thread(refresh)
    wait_until_ready(client, auth, refresh.pk)
    fleet.broadcast("v17")
    client.post(f"/api/v1/refreshes/{refresh.pk}/broadcast_done", "{}", "application/json", **auth)
    thread.join(60)
    refresh.refresh_from_db()
    assert done == [RefreshState.SUCCEEDED], refresh.held_reason
    generations = JournalEntry.objects.filter(
        refresh=refresh, step="verify", operation="generation"
    )
    assert generations.count() == 4 and all(g.ok for g in generations)
    assert not any("sampling_params" in g.request_body for g in generations)
    assert refresh.compat["dynamo_release"]["release"] == "1.7"
