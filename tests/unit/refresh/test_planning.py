"""The stored plan, per admin route family: the exact calls of every step, and what blocks it.

Workers are plain unsaved rows: `plan_worker` judges what discovery wrote and touches neither
the database nor the network (IP-literal URLs need no DNS).
"""

from __future__ import annotations

import json

import pytest
from django.core.exceptions import ValidationError

from controlplane.refresh.planning import generation_check_from_call, update_is_idempotent
from controlplane.refresh.targets import normalize_target
from tests.unit.refresh.builders import (
    BIG_INSTANCE_ID,
    DISK,
    MODEL,
    SGLANG_ROUTES,
    SIDECAR_ROUTES,
    VLLM_ROUTES,
    call,
    discovered,
    plan,
    sglang_static_worker,
    sidecar_worker,
    vllm_worker,
)

GENERATION_BODY = {
    "model": MODEL,
    "prompt": [5, 6, 7, 8],
    # max(the requested 4, the default agreement window of 8 tokens)
    "max_tokens": 8,
    "temperature": 0,
    "logprobs": 0,
    "n": 1,
    "stream": False,
    "nvext": {
        "extra_fields": [
            "completion_token_ids",
            "prompt_token_ids",
            "detailed_finish_reason",
            "worker_id",
        ],
        "backend_instance_id": BIG_INSTANCE_ID,
    },
}
GENERATION = {**call("generation", "v1/completions", GENERATION_BODY), "expected_model": None}
DISTRIBUTED_VLLM = {
    "weight_version": "v8",
    "method": "distributed",
    "group": {"master_address": "10.0.0.1", "master_port": 29500, "group_name": "wu"},
    "update": {"names": ["lm_head.weight"], "dtypes": ["bfloat16"], "shapes": [[8, 8]]},
}
DISTRIBUTED_SIDECAR = {
    "weight_version": "v8",
    "method": "distributed",
    "group": {"init_info": {"master_address": "10.0.0.1", "master_port": 29500}},
    "update": {"update_infos": [{"names": ["a"]}, {"names": ["b"]}]},
}


DIST_LABEL = "distributed (collective broadcast from the trainer)"
NOT_ADVERTISED = "which the worker does not advertise"


def skipped_reason(family: str, operation: str) -> str:
    return (
        f"{family} {operation} already invalidates the prefix cache "
        "(docs: reference/backend-families)"
    )


# -- vLLM Python worker ---------------------------------------------------------------------------


def test_vllm_disk_plan_has_the_exact_call_of_every_step():
    p = plan(vllm_worker())
    assert (p.family, p.blockers) == ("vllm", [])
    assert p.calls == {
        "pause": [call("pause", "engine/pause_generation", {"mode": "keep"})],
        "update": [
            call(
                "update_from_disk",
                "engine/update_weights_from_disk",
                {"model_path": "/ckpt/v7", "weight_version": "v7"},
            )
        ],
        "flush": [],
        "resume_engines": [call("resume", "engine/resume_generation", {})],
        "verify": [
            call("get_weight_version", "engine/get_weight_version", {}),
            call("liveness", "engine/liveness_probe", {}),
            GENERATION,
        ],
    }
    assert p.flush_skipped == skipped_reason("vllm", "update_from_disk")


def test_vllm_auto_pause_drains_requests_in_flight():
    # Not vLLM's own `keep`: kept requests would finish on the new weights (docs/reference/
    # in-flight-requests.md).
    p = plan(vllm_worker(), pause_mode="auto")
    assert (p.pause_mode, p.calls["pause"]) == (
        "wait",
        [call("pause", "engine/pause_generation", {"mode": "wait"})],
    )


@pytest.mark.parametrize("mode", ["keep", "wait", "abort"])
def test_vllm_pause_sends_the_chosen_mode(mode):
    p = plan(vllm_worker(), pause_mode=mode)
    assert p.calls["pause"] == [call("pause", "engine/pause_generation", {"mode": mode})]
    assert p.blockers == []


def test_vllm_flush_policy_always_plans_the_flush():
    p = plan(vllm_worker(), flush_policy="always")
    assert p.calls["flush"] == [call("flush_cache", "engine/flush_cache", {})]
    assert p.flush_skipped == ""


def test_vllm_distributed_update_joins_flat_then_applies_reads_back_and_destroys():
    p = plan(vllm_worker(), DISTRIBUTED_VLLM)
    assert p.blockers == []
    assert (p.update_method, p.rank_offset, p.ranks) == ("distributed", 1, 1)
    assert p.method_reason == (
        "vllm advertises destroy_weights_update_group, get_weight_version, "
        "init_weights_update_group, update_weights_from_distributed"
    )
    # Python workers take the group flat, with their own ranks.
    assert p.calls["group_init"] == [
        call(
            "init_weights_group",
            "engine/init_weights_update_group",
            {**DISTRIBUTED_VLLM["group"], "rank_offset": 1, "world_size": 2},
        )
    ]
    assert p.calls["update"] == [
        call(
            "update_from_distributed",
            "engine/update_weights_from_distributed",
            {**DISTRIBUTED_VLLM["update"], "weight_version": "v8"},
        ),
        call("get_weight_version", "engine/get_weight_version", {}),
    ]
    assert p.calls["group_destroy"] == [
        call("destroy_weights_group", "engine/destroy_weights_update_group", {})
    ]
    assert p.calls["flush"] == []
    assert p.flush_skipped == skipped_reason("vllm", "update_from_distributed")


def test_vllm_distributed_update_that_keeps_the_old_cache_is_a_blocker():
    target = {**DISTRIBUTED_VLLM, "update": {"reset_prefix_cache": False}}
    p = plan(vllm_worker(), target)
    assert p.blockers == ["update: reset_prefix_cache=false would keep the old-weights cache"]


def test_a_worker_without_a_stored_family_is_planned_by_its_routes():
    p = plan(discovered("", VLLM_ROUTES))
    assert p.family == "vllm" and p.blockers == []


# -- vLLM native sidecar --------------------------------------------------------------------------


def test_sidecar_distributed_plan_has_the_exact_call_of_every_step():
    p = plan(sidecar_worker(), DISTRIBUTED_SIDECAR, pause_mode="abort")
    assert (p.family, p.blockers) == ("vllm-sidecar", [])
    info = {**DISTRIBUTED_SIDECAR["group"]["init_info"], "rank_offset": 1, "world_size": 2}
    assert p.calls == {
        # No flush route: the cache is dropped at pause, so clear_cache is always sent.
        "pause": [
            call("pause", "engine/control/pause_generation", {"mode": "abort", "clear_cache": True})
        ],
        # Sidecars take the group as `init_info`; they have no destroy route.
        "group_init": [
            call(
                "init_weights_group",
                "engine/update/init_weight_transfer_engine",
                {"init_info": info},
            )
        ],
        "group_destroy": [],
        "update": [
            call("update_from_distributed", "engine/update/start_weight_update", {}),
            call(
                "update_from_distributed",
                "engine/update/update_weights",
                {"update_info": {"names": ["a"]}},
            ),
            call(
                "update_from_distributed",
                "engine/update/update_weights",
                {"update_info": {"names": ["b"]}},
            ),
            call(
                "update_from_distributed",
                "engine/update/finish_weight_update",
                {"weight_version": "v8"},
            ),
            call("get_weight_version", "engine/control/get_weight_version", {}),
        ],
        "flush": [],
        "resume_engines": [call("resume", "engine/control/resume_generation", {})],
        "verify": [
            call("get_weight_version", "engine/control/get_weight_version", {}),
            call("liveness", "health", None, method="GET"),
            # /health stays ready while paused: the state route says whether it runs.
            call("is_paused", "engine/control/is_paused", {}),
            GENERATION,
        ],
    }
    assert p.flush_skipped == skipped_reason("vllm-sidecar", "update_from_distributed")


@pytest.mark.parametrize("mode", ["keep", "wait", "abort"])
def test_sidecar_pause_sends_the_chosen_mode_and_clears_the_cache(mode):
    p = plan(sidecar_worker(), DISTRIBUTED_SIDECAR, pause_mode=mode)
    assert p.calls["pause"] == [
        call("pause", "engine/control/pause_generation", {"mode": mode, "clear_cache": True})
    ]


def test_sidecar_flush_policy_always_still_skips_since_it_has_no_flush_route():
    p = plan(sidecar_worker(), DISTRIBUTED_SIDECAR, flush_policy="always")
    assert p.blockers == []
    assert p.calls["flush"] == []
    assert p.flush_skipped == skipped_reason("vllm-sidecar", "update_from_distributed")


def test_sidecar_cannot_update_from_disk_nor_flush_after_it():
    p = plan(sidecar_worker())
    assert p.blockers == [
        "update: the native sidecar has no disk reload route; use the distributed method",
        "flush: vllm-sidecar cannot flush_cache",
    ]
    assert p.calls["update"] == [] and p.calls["flush"] == []


# -- SGLang, registered as a static worker --------------------------------------------------------


def test_sglang_disk_plan_has_the_exact_call_of_every_step():
    p = plan(sglang_static_worker(), pause_mode="abort")
    assert (p.family, p.blockers) == ("sglang", [])
    assert p.calls == {
        "pause": [call("pause", "engine/pause_generation", {"mode": "abort"})],
        "update": [
            call(
                "update_from_disk",
                "engine/control/update_weights_from_disk",
                {
                    "model_path": "/ckpt/v7",
                    "weight_version": "v7",
                    "flush_cache": True,
                    "abort_all_requests": True,
                },
            )
        ],
        "flush": [],
        "resume_engines": [call("resume", "engine/continue_generation", {})],
        "verify": [
            call("get_weight_version", "engine/get_weight_version", {}),
            call("liveness", "health", None, method="GET"),
            GENERATION,
        ],
    }
    assert p.flush_skipped == skipped_reason("sglang", "update_from_disk")


def test_sglang_flush_policy_always_plans_the_flush():
    p = plan(sglang_static_worker(), pause_mode="abort", flush_policy="always")
    assert p.calls["flush"] == [call("flush_cache", "engine/flush_cache", {})]
    assert p.flush_skipped == ""


def test_sglang_distributed_update_inits_the_group_then_updates_with_the_version():
    p = plan(sglang_static_worker(), DISTRIBUTED_VLLM, pause_mode="abort")
    assert p.blockers == []
    assert p.calls["group_init"] == [
        call(
            "init_weights_group",
            "engine/init_weights_update_group",
            {**DISTRIBUTED_VLLM["group"], "rank_offset": 1, "world_size": 2},
        )
    ]
    assert p.calls["update"] == [
        call(
            "update_from_distributed",
            "engine/control/update_weights_from_distributed",
            {**DISTRIBUTED_VLLM["update"], "weight_version": "v8"},
        ),
        call("get_weight_version", "engine/get_weight_version", {}),
    ]
    assert p.flush_skipped == skipped_reason("sglang", "update_from_distributed")


@pytest.mark.parametrize("mode", ["keep", "wait"])
def test_sglang_refuses_a_pause_mode_it_does_not_have(mode):
    p = plan(sglang_static_worker(), pause_mode=mode)
    assert p.blockers == [
        f"pause: sglang has no pause mode {mode!r}; choose one of abort, retract, in_place",
    ]
    assert p.calls["pause"] == []


def test_sglang_routes_come_from_the_operator_allowlist_not_the_worker_row():
    allowed = [r for r in SGLANG_ROUTES if r != "get_weight_version"]
    p = plan(sglang_static_worker(allowed, routes=SGLANG_ROUTES), pause_mode="abort")
    assert p.blockers == ["verify: missing route get_weight_version"]


# -- missing routes, per operation ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("route", "target", "blocker"),
    [
        ("pause_generation", None, "pause: missing route pause_generation"),
        (
            "update_weights_from_disk",
            None,
            "update: vllm disk reload needs update_weights_from_disk, "
            "which the worker does not advertise",
        ),
        (
            "init_weights_update_group",
            DISTRIBUTED_VLLM,
            f"update: vllm {DIST_LABEL} needs init_weights_update_group, "
            "which the worker does not advertise",
        ),
        (
            "update_weights_from_distributed",
            DISTRIBUTED_VLLM,
            f"update: vllm {DIST_LABEL} needs update_weights_from_distributed, "
            "which the worker does not advertise",
        ),
        ("resume_generation", None, "resume_engines: missing route resume_generation"),
        ("get_weight_version", None, "verify: missing route get_weight_version"),
        ("liveness_probe", None, "verify: missing route liveness_probe"),
    ],
)
def test_vllm_missing_route_blocks_its_step(route, target, blocker):
    worker = vllm_worker(routes=[r for r in VLLM_ROUTES if r != route])
    assert plan(worker, target or DISK).blockers == [blocker]


@pytest.mark.parametrize(
    ("route", "blocker"),
    [
        ("control/pause_generation", "pause: missing route control/pause_generation"),
        (
            "update/init_weight_transfer_engine",
            f"update: vllm-sidecar {DIST_LABEL} needs update/init_weight_transfer_engine, "
            + NOT_ADVERTISED,
        ),
        (
            "update/start_weight_update",
            f"update: vllm-sidecar {DIST_LABEL} needs update/start_weight_update, {NOT_ADVERTISED}",
        ),
        (
            "update/update_weights",
            f"update: vllm-sidecar {DIST_LABEL} needs update/update_weights, {NOT_ADVERTISED}",
        ),
        (
            "update/finish_weight_update",
            f"update: vllm-sidecar {DIST_LABEL} needs update/finish_weight_update, "
            + NOT_ADVERTISED,
        ),
        ("control/resume_generation", "resume_engines: missing route control/resume_generation"),
    ],
)
def test_sidecar_missing_route_blocks_its_step(route, blocker):
    worker = sidecar_worker(routes=[r for r in SIDECAR_ROUTES if r != route])
    assert plan(worker, DISTRIBUTED_SIDECAR).blockers == [blocker]


@pytest.mark.parametrize(
    ("route", "target", "blocker"),
    [
        ("pause_generation", None, "pause: missing route pause_generation"),
        (
            "control/update_weights_from_disk",
            None,
            "update: sglang disk reload needs control/update_weights_from_disk, "
            "which the worker does not allowlist",
        ),
        (
            "init_weights_update_group",
            DISTRIBUTED_VLLM,
            f"update: sglang {DIST_LABEL} needs init_weights_update_group, "
            "which the worker does not allowlist",
        ),
        (
            "control/update_weights_from_distributed",
            DISTRIBUTED_VLLM,
            f"update: sglang {DIST_LABEL} needs control/update_weights_from_distributed, "
            "which the worker does not allowlist",
        ),
        ("continue_generation", None, "resume_engines: missing route continue_generation"),
        ("get_weight_version", None, "verify: missing route get_weight_version"),
    ],
)
def test_sglang_missing_route_blocks_its_step(route, target, blocker):
    worker = sglang_static_worker([r for r in SGLANG_ROUTES if r != route])
    p = plan(worker, target or DISK, pause_mode="abort")
    assert p.blockers == [blocker]


@pytest.mark.parametrize(
    "worker",
    [
        vllm_worker(routes=[r for r in VLLM_ROUTES if r != "flush_cache"]),
        sglang_static_worker([r for r in SGLANG_ROUTES if r != "flush_cache"]),
    ],
    ids=["vllm", "sglang"],
)
def test_flush_always_without_a_flush_route_skips_since_the_update_already_invalidates(worker):
    p = plan(worker, pause_mode="abort", flush_policy="always")
    assert p.blockers == [] and p.calls["flush"] == []
    assert p.flush_skipped.endswith(
        "already invalidates the prefix cache (docs: reference/backend-families)"
    )


def test_unknown_route_family_is_a_blocker_and_plans_no_calls():
    p = plan(discovered("", ["update/model_taints", "clear_kv_blocks"]))
    assert p.family == "" and p.calls == {}
    assert p.blockers == ["no known admin route family in the advertised routes"]


# -- worker blockers ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "blocker"),
    [
        ({"error": "connection refused"}, "probe error: connection refused"),
        ({"state": "erroring"}, "probe error: worker reported an error"),
        ({"system_url": ""}, "no system_url advertised (worker started without a system port)"),
        (
            {"system_url": "http://192.168.1.5:9090"},
            "system_url outside the allowed networks: "
            "host '192.168.1.5' resolves to 192.168.1.5, outside the allowed networks",
        ),
        (
            {"system_url": "http://169.254.169.254:80"},
            "system_url outside the allowed networks: "
            "host '169.254.169.254' resolves to 169.254.169.254, outside the allowed networks",
        ),
        ({"model": ""}, "verify: no model name for the generation check"),
    ],
    ids=["probe-error", "erroring", "no-system-url", "private", "metadata", "no-model"],
)
@pytest.mark.parametrize(
    ("make", "target", "pause_mode"),
    [
        (vllm_worker, None, "keep"),
        (sidecar_worker, DISTRIBUTED_SIDECAR, "keep"),
        (sglang_static_worker, None, "abort"),
    ],
    ids=["vllm", "sidecar", "sglang"],
)
def test_worker_blockers(make, target, pause_mode, fields, blocker):
    p = plan(make(**fields), target or DISK, pause_mode=pause_mode)
    assert p.blockers == [blocker]


def test_a_system_url_host_name_is_judged_by_every_address_it_resolves_to():
    from controlplane.dynamo.policy import OutboundPolicy

    policy = OutboundPolicy.from_cidrs(
        ["10.0.0.0/8"], resolver=lambda host: ["10.0.0.5", "169.254.169.254"]
    )
    p = plan(vllm_worker(system_url="http://worker-1.internal:9090"), policy=policy)
    assert p.blockers == [
        "system_url outside the allowed networks: host 'worker-1.internal' resolves to "
        "169.254.169.254, outside the allowed networks"
    ]


# -- the generation check -------------------------------------------------------------------------


def test_generation_check_pins_the_exact_u64_instance_id():
    assert BIG_INSTANCE_ID > 2**63
    (check,) = [c for c in plan(vllm_worker()).calls["verify"] if c["operation"] == "generation"]
    pinned = check["body"]["nvext"]["backend_instance_id"]
    assert type(pinned) is int and pinned == BIG_INSTANCE_ID
    # Stored as JSON and read back, the id is still exact (a float would round it).
    stored = json.loads(json.dumps(check))
    assert f'"backend_instance_id": {BIG_INSTANCE_ID}' in json.dumps(check)
    assert generation_check_from_call(stored).backend_instance_id == BIG_INSTANCE_ID
    assert float(BIG_INSTANCE_ID) != BIG_INSTANCE_ID  # why the exactness matters


def test_generation_check_uses_the_expected_model_and_custom_prompt():
    verification = {"expected_model": "policy-v7", "prompt_token_ids": [1, 2], "max_tokens": 2}
    (check,) = [
        c
        for c in plan(vllm_worker(), verification=verification).calls["verify"]
        if c["operation"] == "generation"
    ]
    assert check["expected_model"] == "policy-v7"
    assert check["body"]["model"] == "policy-v7"
    # The check asks for at least the agreement window (8 tokens by default).
    assert (check["body"]["prompt"], check["body"]["max_tokens"]) == ([1, 2], 8)


def test_verification_switches_drop_their_calls():
    verification = {"version_readback": False, "liveness": False, "generation": False}
    p = plan(vllm_worker(model=""), verification=verification)
    # Without a generation check a missing model blocks nothing.
    assert p.calls["verify"] == [] and p.blockers == []


# -- idempotence of the update, for an executor takeover ------------------------------------------


@pytest.mark.parametrize(
    ("family", "method", "idempotent"),
    [
        ("vllm", "disk", True),
        ("sglang", "disk", True),
        ("vllm", "distributed", False),
        ("sglang", "distributed", False),
        ("vllm-sidecar", "distributed", False),
        # Only the declaration and the readback are called (after the trainer's report).
        ("vllm", "external", True),
    ],
)
def test_only_a_disk_reload_is_safe_to_repeat(family, method, idempotent):
    assert update_is_idempotent(family, {"method": method}) is idempotent


def test_a_sidecar_without_version_readback_cannot_take_a_distributed_update():
    worker = sidecar_worker(routes=[r for r in SIDECAR_ROUTES if r != "control/get_weight_version"])
    assert plan(worker, DISTRIBUTED_SIDECAR).blockers == [
        f"update: vllm-sidecar {DIST_LABEL} needs control/get_weight_version, {NOT_ADVERTISED}",
        "verify: missing route control/get_weight_version",
    ]


# -- family from evidence --------------------------------------------------------------------------

#: What every native Rust sidecar (vLLM, SGLang, TRT-LLM) advertises: no engine in the names.
NATIVE_ONLY = [
    "control/pause_generation",
    "control/resume_generation",
    "control/get_weight_version",
    "update/update_weight_version",
]


def _declared(worker, family="", per_namespace=None):
    from controlplane.fleet.models import Source

    worker.source = Source(
        pk=7, name="s", declared_family=family, declared_families=per_namespace or {}
    )
    return worker


def test_an_ambiguous_native_sidecar_is_refused_by_name_and_nothing_is_planned():
    # Stored as a vLLM sidecar by an older discovery: the routes alone decide now.
    p = plan(discovered("vllm-sidecar", NATIVE_ONLY), pause_mode="auto")
    assert p.blockers == [
        "ambiguous family: only native sidecar routes (control/*, update/*), which the vLLM, "
        "SGLang and TRT-LLM sidecars all advertise; declare the family on the source or namespace"
    ]
    assert p.calls == {} and p.family == ""


def test_a_declared_family_decides_where_routes_do_not():
    worker = _declared(discovered("", NATIVE_ONLY), per_namespace={"rl-a": "vllm-sidecar"})
    p = plan(worker, pause_mode="auto")
    assert p.family == "vllm-sidecar"
    assert p.calls["pause"] == [
        call("pause", "engine/control/pause_generation", {"mode": "wait", "clear_cache": True})
    ]


def test_a_declared_sidecar_without_an_adapter_is_refused_by_name():
    worker = _declared(discovered("", NATIVE_ONLY), family="sglang-sidecar")
    p = plan(worker, pause_mode="auto")
    assert p.blockers == [
        "declared family sglang-sidecar: there is no adapter for the native SGLang sidecar, so "
        "it is never paused or updated"
    ]
    assert p.calls == {}


# -- external: the trainer's framework applies the weights ----------------------------------------

EXTERNAL = {"weight_version": "v12", "method": "external"}


def test_vllm_external_update_calls_no_update_route_and_declares_then_reads_back():
    p = plan(vllm_worker(), EXTERNAL)
    assert (p.blockers, p.update_method) == ([], "external")
    assert "trainer applies the weights" in p.method_reason
    assert "set_weight_version" in p.method_reason
    assert p.calls["update"] == [
        call("set_weight_version", "engine/set_weight_version", {"weight_version": "v12"}),
        call("get_weight_version", "engine/get_weight_version", {}),
    ]
    # Nobody knows whether the framework's transfer dropped the old prefix cache: flush.
    assert p.calls["flush"] == [call("flush_cache", "engine/flush_cache", {})]
    assert p.calls["pause"] and p.calls["resume_engines"]


def test_external_update_without_set_weight_version_only_reads_back():
    worker = vllm_worker(routes=[r for r in VLLM_ROUTES if r != "set_weight_version"])
    p = plan(worker, EXTERNAL)
    assert p.blockers == []
    assert "only read back" in p.method_reason
    assert p.calls["update"] == [call("get_weight_version", "engine/get_weight_version", {})]


def test_an_external_policy_without_a_trainer_to_apply_it_is_blocked():
    # A drifted worker's catch-up or a canary's rollback plans the gate's policy with no trainer
    # waiting to apply it: declaring the version alone would admit old weights as new.
    p = plan(vllm_worker(), EXTERNAL, trainer_applies=False)
    assert p.calls["update"] == []
    assert p.blockers == [
        "update: an external policy's weights are applied by the trainer's framework; only a "
        "policy refresh (which waits for its applied report) can load them"
    ]


def test_external_apply_timeout_defaults_and_must_be_positive(settings):
    settings.REFRESH_APPLY_TIMEOUT_SECONDS = 42.0
    assert normalize_target(EXTERNAL)["apply_timeout_s"] == 42.0
    assert normalize_target({**EXTERNAL, "apply_timeout_s": 5})["apply_timeout_s"] == 5.0
    with pytest.raises(ValidationError, match="apply_timeout_s must be a positive"):
        normalize_target({**EXTERNAL, "apply_timeout_s": 0})
