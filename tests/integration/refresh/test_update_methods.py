"""SGLang pause modes and memory release, and LoRA load/swap, end to end on the simulated fleet."""

from __future__ import annotations

import pytest

from controlplane.audit.recorder import Actor
from controlplane.fleet.services import add_static_worker
from controlplane.refresh.models import JournalEntry, RefreshState
from controlplane.simfleet import FleetConfig, WorkerSpec
from tests.integration.refresh.helpers import (
    fleet_config,
    fleet_versions,
    make_source,
    paused_workers,
    run_inline,
)

pytestmark = pytest.mark.django_db

SGLANG_ALLOWLIST = [
    "pause_generation",
    "continue_generation",
    "control/update_weights_from_disk",
    "release_memory_occupation",
    "resume_memory_occupation",
]


def sglang_fleet(simfleet_factory, version_route: str, **spec):
    """Two SGLang workers registered as static workers (SGLang is not discoverable). Both are
    replicas of one component on one host, so the frontend's `/health` cannot tell them apart:
    the operator declares each one's instance id, and discovery checks it is registered.
    `version_route` is the `--engine-route` descriptor serving the weight-version read."""
    fleet = simfleet_factory(FleetConfig(workers=[], listener_env={"DYN_NAMESPACE": "rl-a"}))
    source = make_source(fleet)
    for name in ("sgl-1", "sgl-2"):
        key = fleet.add_worker(
            WorkerSpec(
                namespace="rl-a",
                family="sglang",
                engine_routes=[version_route],
                version="v1",
                **spec,
            )
        )
        add_static_worker(
            source,
            actor=Actor.system("test"),
            name=name,
            namespace="rl-a",
            system_url=fleet.state(key)["system_url"],
            family="sglang",
            allowed_routes=[*SGLANG_ALLOWLIST, version_route],
            model="sim-model",
            declared_instance_id=str(fleet.state(key)["instance_id"]),
        )
    return fleet, source


def journal_of(refresh, step):
    return list(JournalEntry.objects.filter(refresh=refresh, step=step).order_by("id"))


@pytest.mark.parametrize(
    ("pause_mode", "sent"),
    [("auto", "abort"), ("abort", "abort"), ("retract", "retract"), ("in_place", "in_place")],
)
def test_sglang_refreshes_with_each_of_its_pause_modes(
    simfleet_factory, operator, pause_mode, sent
):
    fleet, source = sglang_fleet(simfleet_factory, "get_weight_version")
    refresh = run_inline(source, operator, "v2", pause_mode=pause_mode)

    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    assert set(fleet_versions(fleet).values()) == {"v2"}
    assert paused_workers(fleet) == []
    pauses = journal_of(refresh, "pause")
    assert [p.request_body for p in pauses] == [{"mode": sent}] * 2
    assert all(p.url.endswith("/engine/pause_generation") for p in pauses)
    assert {w.pause_mode for w in refresh.workers.all()} == {sent}
    assert {w.update_method for w in refresh.workers.all()} == {"disk"}


def test_the_sglang_default_is_never_a_vllm_mode(simfleet_factory, operator):
    _fleet, source = sglang_fleet(simfleet_factory, "get_weight_version")
    refresh = run_inline(
        source, operator, "v2", pause_modes={"vllm": "keep"}, inflight_may_straddle=True
    )
    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    assert [p.request_body for p in journal_of(refresh, "pause")] == [{"mode": "abort"}] * 2


def test_sglang_memory_release_as_the_pause_method(simfleet_factory, operator):
    # The readback route is configured under another path: the plan calls that path.
    fleet, source = sglang_fleet(simfleet_factory, "weights/version=get_weight_version:engine")
    refresh = run_inline(source, operator, "v3", pause_modes={"sglang": "release_memory"})

    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    assert set(fleet_versions(fleet).values()) == {"v3"}
    assert all(w["released"] == [] and not w["paused"] for w in fleet.workers())
    pause_urls = [j.url.rsplit("/engine/", 1)[1] for j in journal_of(refresh, "pause")]
    assert pause_urls == ["pause_generation", "release_memory_occupation"] * 2
    resume_urls = [j.url.rsplit("/engine/", 1)[1] for j in journal_of(refresh, "resume_engines")]
    assert resume_urls == ["resume_memory_occupation", "continue_generation"] * 2
    readback = [j for j in journal_of(refresh, "verify") if j.operation == "get_weight_version"]
    assert all(j.url.endswith("/engine/weights/version") for j in readback)
    # The KV cache went with its memory: no flush was needed.
    assert {w.flush_skipped for w in refresh.workers.all()} == {
        "sglang released its KV cache memory at pause"
    }


def test_a_vllm_mode_for_sglang_is_refused_before_anything_runs(simfleet_factory, operator):
    from django.core.exceptions import ValidationError

    from controlplane.refresh import intents

    _fleet, source = sglang_fleet(simfleet_factory, "get_weight_version")
    with pytest.raises(ValidationError, match="sglang has no pause mode 'keep'"):
        intents.plan_policy_refresh(
            source=source,
            actor=Actor.for_user(operator),
            target={"weight_version": "v2", "method": "disk", "model_path": "/ckpt/v2"},
            pause_modes={"sglang": "keep"},
        )
    refresh = intents.plan_policy_refresh(
        source=source,
        actor=Actor.for_user(operator),
        target={"weight_version": "v2", "method": "disk", "model_path": "/ckpt/v2"},
        pause_mode="keep",
        inflight_may_straddle=True,
    )
    assert refresh.plan_blockers
    assert {tuple(w.blockers) for w in refresh.workers.all()} == {
        ("pause: sglang has no pause mode 'keep'; choose one of abort, retract, in_place",)
    }


# -- LoRA -----------------------------------------------------------------------------------


def lora_fleet(simfleet_factory, *, hotswap: bool, capacity: int = 2):
    config = fleet_config(4, seed=3)
    for spec in config.workers:
        spec.lora_capacity = capacity
        spec.lora_hotswap = hotswap
    return simfleet_factory(config)


def lora_target(version, action, name="policy-a", uri="s3://ckpt/a/1"):
    return {
        "weight_version": version,
        "method": "lora",
        "lora": {"action": action, "lora_name": name, "uri": uri},
    }


def pinned_generations(refresh):
    return [j for j in journal_of(refresh, "verify") if j.operation == "generation"]


def test_lora_load_is_verified_by_a_pinned_generation_naming_the_adapter(
    simfleet_factory, operator
):
    fleet = lora_fleet(simfleet_factory, hotswap=False)
    source = make_source(fleet)
    refresh = run_inline(source, operator, target=lora_target("v2", "load"))

    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    loads = journal_of(refresh, "update")
    assert [j.request_body for j in loads if j.url.endswith("/load_lora")] == [
        {"lora_name": "policy-a", "source": {"uri": "s3://ckpt/a/1"}}
    ] * 4
    generations = pinned_generations(refresh)
    assert len(generations) == 4 and all(g.ok for g in generations)
    assert {g.request_body["model"] for g in generations} == {"policy-a"}
    assert {g.response_body["model"] for g in generations} == {"policy-a"}
    assert all(g.request_body["nvext"]["backend_instance_id"] for g in generations)
    assert set(fleet_versions(fleet).values()) == {"v2"}
    ran = refresh.compat["verification"]["ran"]
    assert ran["ok"] is True and ran["weight_version"] == "v2"
    assert refresh.compat["update_method"] == "lora"


def test_lora_swap_needs_a_real_hot_swap(simfleet_factory, operator):
    fleet = lora_fleet(simfleet_factory, hotswap=True)
    source = make_source(fleet)
    first = run_inline(source, operator, target=lora_target("v2", "load"))
    assert first.state == RefreshState.SUCCEEDED, first.held_reason
    loaded = [g.response_body["nvext"]["completion_token_ids"] for g in pinned_generations(first)]

    swap = run_inline(source, operator, target=lora_target("v3", "swap", uri="s3://ckpt/a/2"))
    assert swap.state == RefreshState.SUCCEEDED, swap.held_reason
    replies = [j.response_body for j in journal_of(swap, "update") if j.url.endswith("load_lora")]
    assert all(r["hot_swap"] is True for r in replies) and len(replies) == 4
    swapped = [g.response_body["nvext"]["completion_token_ids"] for g in pinned_generations(swap)]
    # The adapter's new weights generate differently, on every worker alike.
    assert swapped != loaded and len({tuple(ids) for ids in swapped}) == 1


def test_a_swap_without_hot_swap_enabled_holds(simfleet_factory, operator):
    fleet = lora_fleet(simfleet_factory, hotswap=False)
    source = make_source(fleet)
    assert run_inline(source, operator, target=lora_target("v2", "load")).state == "succeeded"
    swap = run_inline(source, operator, target=lora_target("v3", "swap", uri="s3://ckpt/a/2"))
    assert swap.state == RefreshState.HELD
    assert "did not hot-swap the adapter" in swap.held_reason


def test_lora_capacity_is_enforced(simfleet_factory, operator):
    fleet = lora_fleet(simfleet_factory, hotswap=False, capacity=1)
    source = make_source(fleet)
    assert run_inline(source, operator, target=lora_target("v2", "load")).state == "succeeded"
    second = run_inline(source, operator, target=lora_target("v3", "load", name="policy-b"))
    assert second.state == RefreshState.HELD
    assert "LoRA capacity exceeded: at most 1 adapter(s) may be loaded" in second.held_reason


def test_sglang_disk_update_resets_the_cache_and_the_page_counts_paused_requests(
    simfleet_factory, operator, operator_client
):
    from django.urls import reverse

    fleet, source = sglang_fleet(simfleet_factory, "get_weight_version", paused_requests=2)
    refresh = run_inline(source, operator, "v2", pause_mode="retract")
    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    updates = journal_of(refresh, "update")
    assert {
        (u.request_body["flush_cache"], u.request_body["abort_all_requests"]) for u in updates
    } == {(True, True)}
    assert {u.response_body["num_paused_requests"] for u in updates} == {2}
    # The paused requests were dropped, never finished on the new weights.
    assert {w["paused_requests"] for w in fleet.workers()} == {0}
    page = operator_client.get(reverse("refresh:detail", args=[refresh.pk])).content.decode()
    assert 'id="in-flight"' in page
    assert "2 aborted (mode retract; SGLang update reply (num_paused_requests))" in page


def test_the_compatibility_record_names_the_dynamo_release(simfleet_factory, operator):
    _fleet, source = sglang_fleet(simfleet_factory, "get_weight_version")
    refresh = run_inline(source, operator, "v2")
    assert refresh.compat["dynamo_release"] == {
        "release": "1.6.1",
        "from": "default (not declared)",
        "contract": "run: real frontend, RL listener, runtime, system servers and the native "
        "vLLM sidecar (tests/interop)",
    }
    source.dynamo_release = "1.7"
    source.save(update_fields=["dynamo_release"])
    again = run_inline(source, operator, "v3")
    assert again.compat["dynamo_release"]["release"] == "1.7"
    assert again.compat["dynamo_release"]["from"] == "declared on the source"
