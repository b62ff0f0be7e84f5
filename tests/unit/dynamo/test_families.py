# ruff: noqa: E501  (contract messages are quoted verbatim)
"""Every success and failure body from contract §3 to §6, per family."""

import pytest

from controlplane.dynamo.families import (
    FAMILIES,
    SGLANG,
    VLLM_SIDECAR,
    VLLM_WORKER,
    AdminCall,
    Operation,
    UnsupportedOperation,
    detect_family,
    family_verdict,
    routes_fit,
)

Op = Operation

VLLM_ADVERTISED = [
    "destroy_weights_update_group",
    "flush_cache",
    "get_weight_version",
    "init_weights_update_group",
    "liveness_probe",
    "pause_generation",
    "resume_generation",
    "set_weight_version",
    "update_weights_from_disk",
    "update_weights_from_distributed",
    "update_weights_from_tensor",
]
SIDECAR_ADVERTISED = [
    "control/get_weight_version",
    "control/is_paused",
    "control/is_sleeping",
    "control/pause_generation",
    "control/resume_generation",
    "control/sleep",
    "control/wake_up",
    "update/finish_weight_update",
    "update/init_weight_transfer_engine",
    "update/model_taints",
    "update/start_weight_update",
    "update/update_weight_version",
    "update/update_weights",
]
SGLANG_ALLOWLIST = [
    "pause_generation",
    "continue_generation",
    "control/update_weights_from_disk",
    "control/update_weight_version",
]


def one(family, op, **params) -> AdminCall:
    (call,) = family.build(op, **params)
    return call


# ---- detection ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("routes", "family"),
    [
        (VLLM_ADVERTISED, VLLM_WORKER),
        (SIDECAR_ADVERTISED, VLLM_SIDECAR),
        (SGLANG_ALLOWLIST, SGLANG),
        (["pause_generation"], VLLM_WORKER),
        (["update/model_taints"], None),
        ([], None),
        (["something_else"], None),
    ],
)
def test_detect_family(routes, family):
    assert detect_family(routes) is family


#: What every native Rust sidecar (vLLM, SGLang, TRT-LLM) advertises: no engine in the names.
NATIVE_ONLY = [
    "control/pause_generation",
    "control/resume_generation",
    "control/get_weight_version",
    "update/update_weight_version",
]


def test_native_sidecar_routes_alone_are_an_ambiguous_family_refused_by_name():
    # A native SGLang sidecar advertises these too: it must never be driven as vLLM's.
    assert detect_family(NATIVE_ONLY) is None
    verdict = family_verdict(NATIVE_ONLY)
    assert verdict.family is None
    assert verdict.reason.startswith("ambiguous family: only native sidecar routes")
    assert "declare the family on the source or namespace" in verdict.reason


@pytest.mark.parametrize(
    ("routes", "declared", "family", "reason"),
    [
        (NATIVE_ONLY, "vllm-sidecar", VLLM_SIDECAR, ""),
        (SIDECAR_ADVERTISED, "", VLLM_SIDECAR, ""),
        (SIDECAR_ADVERTISED, "vllm-sidecar", VLLM_SIDECAR, ""),
        (
            NATIVE_ONLY,
            "sglang-sidecar",
            None,
            "declared family sglang-sidecar: there is no adapter for the native SGLang sidecar",
        ),
        (
            SIDECAR_ADVERTISED,
            "sglang",
            None,
            "declared family sglang contradicts the advertised routes, which are vllm-sidecar's",
        ),
        (VLLM_ADVERTISED, "vllm-sidecar", None, "declared family vllm-sidecar contradicts"),
        (NATIVE_ONLY, "vllm", None, "declared family vllm does not advertise these routes"),
    ],
)
def test_a_declaration_decides_only_where_routes_do_not(routes, declared, family, reason):
    verdict = family_verdict(routes, declared)
    assert verdict.family is family
    assert verdict.reason.startswith(reason)


def test_a_relisted_native_sidecar_still_fits_its_declared_plan():
    assert routes_fit(NATIVE_ONLY, "vllm-sidecar")
    assert not routes_fit(NATIVE_ONLY, "vllm")
    assert not routes_fit(VLLM_ADVERTISED, "vllm-sidecar")


def test_registry_names():
    assert FAMILIES == {"vllm": VLLM_WORKER, "vllm-sidecar": VLLM_SIDECAR, "sglang": SGLANG}


# ---- routes are verbatim ------------------------------------------------------------------


@pytest.mark.parametrize("family", [VLLM_WORKER, VLLM_SIDECAR, SGLANG])
def test_paths_are_engine_plus_route_verbatim(family):
    for op, required in family.routes.items():
        for call in family.build(op, **SAMPLE_PARAMS[op]):
            if call.path == "health":
                assert op == Op.LIVENESS and call.method == "GET"
                continue
            assert call.path == "engine/" + call.route
            assert call.route in required


SAMPLE_PARAMS = {
    Op.LIVENESS: {},
    Op.PAUSE: {},
    Op.RESUME: {},
    Op.FLUSH_CACHE: {},
    Op.UPDATE_FROM_DISK: {"model_path": "/ckpt/7"},
    Op.INIT_WEIGHTS_GROUP: {"init_info": {"master_address": "10.0.0.1"}},
    Op.UPDATE_FROM_DISTRIBUTED: {"update_infos": [{"names": ["w"]}]},
    Op.DESTROY_WEIGHTS_GROUP: {},
    Op.GET_WEIGHT_VERSION: {},
    Op.SET_WEIGHT_VERSION: {"weight_version": "v7"},
    Op.UPDATE_FROM_TENSOR: {"serialized_named_tensors": ["x"]},
    Op.LOAD_LORA: {"lora_name": "a", "uri": "file:///a"},
    Op.SWAP_LORA: {"lora_name": "a", "uri": "file:///b"},
    Op.UNLOAD_LORA: {"lora_name": "a"},
    Op.RELEASE_MEMORY: {"tags": ["kv_cache"]},
    Op.RESUME_MEMORY: {},
    Op.IS_PAUSED: {},
    Op.IS_SLEEPING: {},
    Op.SLEEP: {"level": 1},
    Op.WAKE_UP: {"tags": ["weights"]},
}


def test_capabilities():
    assert VLLM_WORKER.supports(Op.UPDATE_FROM_DISK, VLLM_ADVERTISED)
    assert not VLLM_WORKER.supports(Op.UPDATE_FROM_DISK, ["pause_generation"])
    assert VLLM_WORKER.missing_routes(Op.PAUSE, []) == {"pause_generation"}
    assert VLLM_SIDECAR.supports(Op.UPDATE_FROM_DISTRIBUTED, SIDECAR_ADVERTISED)
    assert not VLLM_SIDECAR.supports(
        Op.UPDATE_FROM_DISTRIBUTED, ["update/start_weight_update", "update/update_weights"]
    )
    # No flush or disk route exists on the sidecar.
    assert not VLLM_SIDECAR.supports(Op.FLUSH_CACHE, SIDECAR_ADVERTISED)
    assert not VLLM_SIDECAR.supports(Op.UPDATE_FROM_DISK, SIDECAR_ADVERTISED)
    with pytest.raises(UnsupportedOperation):
        VLLM_SIDECAR.build(Op.FLUSH_CACHE)
    assert VLLM_SIDECAR.supports(Op.LIVENESS, [])  # /health needs no advertised route
    assert SGLANG.supports(Op.SET_WEIGHT_VERSION, SGLANG_ALLOWLIST)
    assert not SGLANG.supports(Op.INIT_WEIGHTS_GROUP, SGLANG_ALLOWLIST)


# ---- vLLM Python worker (§4) --------------------------------------------------------------


def test_vllm_builds():
    assert one(VLLM_WORKER, Op.PAUSE, mode="keep") == AdminCall(
        Op.PAUSE, "POST", "engine/pause_generation", {"mode": "keep"}
    )
    assert one(VLLM_WORKER, Op.PAUSE, mode="abort", clear_cache=1).body == {
        "mode": "abort",
        "clear_cache": True,
    }
    with pytest.raises(ValueError, match="invalid pause mode"):
        VLLM_WORKER.build(Op.PAUSE, mode="drain")
    assert one(VLLM_WORKER, Op.UPDATE_FROM_DISK, model_path="/p", weight_version="v2").body == {
        "model_path": "/p",
        "weight_version": "v2",
    }
    with pytest.raises(ValueError, match="model_path"):
        VLLM_WORKER.build(Op.UPDATE_FROM_DISK)
    assert one(VLLM_WORKER, Op.SET_WEIGHT_VERSION, weight_version=None).body == {
        "weight_version": None
    }
    dist = one(VLLM_WORKER, Op.UPDATE_FROM_DISTRIBUTED, weight_version="v3", names=["a"])
    assert dist.path == "engine/update_weights_from_distributed"
    assert dist.body == {"weight_version": "v3", "names": ["a"]}
    with pytest.raises(ValueError, match="old-weights cache"):
        VLLM_WORKER.build(Op.UPDATE_FROM_DISTRIBUTED, reset_prefix_cache=False)
    assert one(VLLM_WORKER, Op.INIT_WEIGHTS_GROUP, rank_offset=1).path == (
        "engine/init_weights_update_group"
    )
    assert one(VLLM_WORKER, Op.DESTROY_WEIGHTS_GROUP).path == "engine/destroy_weights_update_group"
    assert one(VLLM_WORKER, Op.LIVENESS).path == "engine/liveness_probe"


def test_vllm_cache_invalidation():
    assert VLLM_WORKER.update_invalidates_cache(Op.UPDATE_FROM_DISK)
    assert VLLM_WORKER.update_invalidates_cache(Op.UPDATE_FROM_DISTRIBUTED)
    assert not VLLM_WORKER.update_invalidates_cache(Op.SET_WEIGHT_VERSION)


VLLM_CASES = [
    # (op, http, body, ok, error fragment or data subset)
    (Op.LIVENESS, 200, {"status": "ok", "alive": True}, True, None),
    (
        Op.LIVENESS,
        200,
        {"status": "error", "alive": False, "message": "engine dead"},
        False,
        "engine dead",
    ),
    (Op.LIVENESS, 200, {"status": "ok", "alive": False}, False, "alive=true"),
    (
        Op.PAUSE,
        200,
        {"status": "ok", "message": "Engine paused", "mode": "keep", "clear_cache": False},
        True,
        None,
    ),
    (
        Op.PAUSE,
        200,
        {"status": "error", "message": "Invalid mode 'x'; expected keep|wait|abort"},
        False,
        "Invalid mode 'x'",
    ),
    (
        Op.PAUSE,
        200,
        {
            "status": "error",
            "message": "Cannot pause generation in keep mode with active LoRA requests: a, b",
        },
        False,
        "active LoRA requests: a, b",
    ),
    (
        Op.PAUSE,
        200,
        {"status": "error", "message": "request body must be a JSON object"},
        False,
        "must be a JSON object",
    ),
    (Op.RESUME, 200, {"status": "ok", "message": "Engine resumed"}, True, None),
    (Op.FLUSH_CACHE, 200, {"status": "ok", "message": "Cache flushed"}, True, None),
    (
        Op.GET_WEIGHT_VERSION,
        200,
        {"status": "ok", "version": None, "version_declared": False},
        True,
        {"version": None, "version_declared": False},
    ),
    (
        Op.GET_WEIGHT_VERSION,
        200,
        {"status": "ok", "version": "v7", "version_declared": True},
        True,
        {"version": "v7", "version_declared": True},
    ),
    (Op.GET_WEIGHT_VERSION, 200, {"status": "ok"}, False, "version_declared"),
    (Op.SET_WEIGHT_VERSION, 200, {"status": "ok", "version": "v7"}, True, None),
    (
        Op.SET_WEIGHT_VERSION,
        200,
        {"status": "error", "message": "Missing 'weight_version' in body"},
        False,
        "Missing 'weight_version'",
    ),
    (
        Op.UPDATE_FROM_DISK,
        200,
        {"status": "ok", "version": "v7", "version_declared": True},
        True,
        {"version_declared": True},
    ),
    (
        Op.UPDATE_FROM_DISK,
        200,
        {"status": "ok", "version": "unknown", "version_declared": False},
        True,
        {"version_declared": False},
    ),
    (
        Op.UPDATE_FROM_DISK,
        200,
        {
            "status": "error",
            "message": "Worker must be paused via pause_generation() before updating weights. Call pause_generation() first, then update, then resume_generation().",
        },
        False,
        "Worker must be paused",
    ),
    (
        Op.UPDATE_FROM_DISK,
        200,
        {"status": "error", "message": "Missing 'model_path' in body"},
        False,
        "Missing 'model_path'",
    ),
    (
        Op.UPDATE_FROM_DISTRIBUTED,
        200,
        {"status": "error", "message": "'allow_unpaused' must be a boolean"},
        False,
        "allow_unpaused",
    ),
    (
        Op.UPDATE_FROM_DISTRIBUTED,
        200,
        {
            "status": "error",
            "message": "Unpaused weight updates cannot reset the prefix cache. Set 'reset_prefix_cache' to false or pause generation first.",
        },
        False,
        "cannot reset the prefix cache",
    ),
    (
        Op.INIT_WEIGHTS_GROUP,
        200,
        {"status": "ok", "message": "Weight update group initialized"},
        True,
        None,
    ),
    (
        Op.DESTROY_WEIGHTS_GROUP,
        200,
        {"status": "ok", "message": "Weight update group destroyed"},
        True,
        None,
    ),
    # System-server failures (§3).
    (
        Op.PAUSE,
        500,
        {"error": "Handler error", "message": "Python callback failed: RuntimeError: kaboom"},
        False,
        "HTTP 500: Handler error: Python callback failed: RuntimeError: kaboom",
    ),
    (
        Op.PAUSE,
        404,
        {"error": "Route not found", "message": "Route /engine/nope not found"},
        False,
        "HTTP 404: Route not found",
    ),
    (
        Op.PAUSE,
        400,
        {"error": "Invalid JSON", "message": "expected ident at line 1 column 2"},
        False,
        "HTTP 400: Invalid JSON",
    ),
    (Op.RESUME, 200, None, False, "got a NoneType body"),  # handler returned None
    (Op.RESUME, 200, ["x"], False, "list"),
    (Op.RESUME, 200, {"message": "Engine resumed"}, False, "expected status 'ok'"),
    (Op.RESUME, 503, "Service Unavailable", False, "HTTP 503"),
]


@pytest.mark.parametrize(("op", "http", "body", "ok", "expect"), VLLM_CASES)
def test_vllm_interpret(op, http, body, ok, expect):
    call = one(VLLM_WORKER, op, **SAMPLE_PARAMS[op])
    outcome = VLLM_WORKER.interpret(call, http, body)
    assert outcome.ok is ok
    if ok:
        assert outcome.error is None
        if isinstance(expect, dict):
            assert expect.items() <= outcome.data.items()
    else:
        assert expect in outcome.error


def test_status_error_uppercase_is_still_failure():
    # Python vLLM compares exactly, the Rust wrapper case-insensitively; we are the stricter one.
    outcome = VLLM_WORKER.interpret(one(VLLM_WORKER, Op.RESUME), 200, {"status": "ERROR"})
    assert not outcome.ok


# ---- vLLM native sidecar (§5) -------------------------------------------------------------


def test_sidecar_builds():
    assert one(VLLM_SIDECAR, Op.PAUSE) == AdminCall(
        Op.PAUSE, "POST", "engine/control/pause_generation", {"clear_cache": True}
    )
    assert one(VLLM_SIDECAR, Op.PAUSE, mode="keep", clear_cache=False).body == {
        "mode": "keep",
        "clear_cache": False,
    }
    assert one(VLLM_SIDECAR, Op.RESUME).path == "engine/control/resume_generation"
    assert one(VLLM_SIDECAR, Op.LIVENESS) == AdminCall(Op.LIVENESS, "GET", "health", None)
    assert one(VLLM_SIDECAR, Op.INIT_WEIGHTS_GROUP, init_info={"a": 1}) == AdminCall(
        Op.INIT_WEIGHTS_GROUP,
        "POST",
        "engine/update/init_weight_transfer_engine",
        {"init_info": {"a": 1}},
    )
    calls = VLLM_SIDECAR.build(
        Op.UPDATE_FROM_DISTRIBUTED, update_infos=[{"n": 1}, {"n": 2}], weight_version="v9"
    )
    assert [(c.path, c.body) for c in calls] == [
        ("engine/update/start_weight_update", {}),
        ("engine/update/update_weights", {"update_info": {"n": 1}}),
        ("engine/update/update_weights", {"update_info": {"n": 2}}),
        ("engine/update/finish_weight_update", {"weight_version": "v9"}),
    ]
    assert one(VLLM_SIDECAR, Op.SET_WEIGHT_VERSION, weight_version="v9").body == {
        "new_version": "v9"
    }
    with pytest.raises(ValueError):
        VLLM_SIDECAR.build(Op.SET_WEIGHT_VERSION, weight_version="")
    with pytest.raises(ValueError):
        VLLM_SIDECAR.build(Op.UPDATE_FROM_DISTRIBUTED, update_infos=[])
    with pytest.raises(ValueError):
        VLLM_SIDECAR.build(Op.INIT_WEIGHTS_GROUP, init_info="x")
    with pytest.raises(ValueError, match="invalid pause mode"):
        VLLM_SIDECAR.build(Op.PAUSE, mode="bogus")


def test_sidecar_cache_is_cleared_at_pause():
    assert VLLM_SIDECAR.update_invalidates_cache(Op.UPDATE_FROM_DISTRIBUTED)
    assert not VLLM_SIDECAR.update_invalidates_cache(
        Op.UPDATE_FROM_DISTRIBUTED, clear_cache_on_pause=False
    )


def sidecar_call(route_suffix):
    calls = {
        c.path: c for op in VLLM_SIDECAR.routes for c in VLLM_SIDECAR.build(op, **SAMPLE_PARAMS[op])
    }
    return calls[route_suffix]


SIDECAR_CASES = [
    ("engine/control/pause_generation", 200, {"status": "paused"}, True, None),
    (
        "engine/control/pause_generation",
        200,
        {
            "status": "error",
            "message": "InvalidRequest: pause_generation mode must be abort, wait, or keep; got `bogus`",
        },
        False,
        "got `bogus`",
    ),
    (
        "engine/control/pause_generation",
        200,
        {"status": "error", "message": "InvalidRequest: `clear_cache` must be a boolean"},
        False,
        "must be a boolean",
    ),
    (
        "engine/control/pause_generation",
        200,
        {"status": "error", "message": "engine control request body must be a JSON object"},
        False,
        "engine control request body",
    ),
    (
        "engine/control/pause_generation",
        500,
        {
            "error": "Handler error",
            "message": "InvalidRequest: PauseGeneration: busy (FailedPrecondition)",
        },
        False,
        "PauseGeneration: busy (FailedPrecondition)",
    ),
    ("engine/control/pause_generation", 200, {"status": "ok"}, False, "expected status 'paused'"),
    (
        "engine/control/pause_generation",
        200,
        {
            "status": "error",
            "message": "engine administrative routes are unavailable while the worker is starting",
        },
        False,
        "while the worker is starting",
    ),
    ("engine/control/resume_generation", 200, {"status": "resumed"}, True, None),
    (
        "engine/control/resume_generation",
        200,
        {"status": "resumed", "is_sleeping": True},
        False,
        "still sleeping",
    ),
    (
        "engine/control/resume_generation",
        200,
        {
            "status": "error",
            "message": "engine resumed but re-registration failed after /engine/control/resume_generation: x; retry /engine/control/resume_generation to rejoin discovery",
        },
        False,
        "re-registration failed",
    ),
    (
        "engine/control/get_weight_version",
        200,
        {"weight_version": ""},
        True,
        {"version": None, "version_declared": False},
    ),
    (
        "engine/control/get_weight_version",
        200,
        {"weight_version": "v9"},
        True,
        {"version": "v9", "version_declared": True},
    ),
    ("engine/control/get_weight_version", 200, {"status": "ok"}, False, "weight_version"),
    (
        "engine/update/init_weight_transfer_engine",
        200,
        {"message": "Weight transfer initialized"},
        True,
        None,
    ),
    (
        "engine/update/init_weight_transfer_engine",
        500,
        {"error": "Handler error", "message": "InvalidRequest: missing `init_info` JSON object"},
        False,
        "missing `init_info` JSON object",
    ),
    ("engine/update/start_weight_update", 200, {"message": "Weight update started"}, True, None),
    ("engine/update/update_weights", 200, {"message": "Weights updated"}, True, None),
    (
        "engine/update/update_weights",
        500,
        {"error": "Handler error", "message": "InvalidRequest: missing `update_info` JSON object"},
        False,
        "missing `update_info`",
    ),
    (
        "engine/update/update_weights",
        200,
        {"status": "error", "message": "engine update request body must be a JSON object"},
        False,
        "engine update request body",
    ),
    ("engine/update/finish_weight_update", 200, {"message": "Weight update finished"}, True, None),
    (
        "engine/update/finish_weight_update",
        500,
        {"error": "Handler error", "message": "InvalidRequest: `weight_version` must be a string"},
        False,
        "must be a string",
    ),
    ("engine/update/finish_weight_update", 200, {}, False, "lacks its 'message'"),
    (
        "engine/update/update_weight_version",
        200,
        {"success": True, "new_version": "v9"},
        True,
        {"version": "v9"},
    ),
    (
        "engine/update/update_weight_version",
        500,
        {
            "error": "Handler error",
            "message": "InvalidRequest: missing non-empty `new_version` string",
        },
        False,
        "new_version",
    ),
    (
        "engine/update/update_weight_version",
        200,
        {"success": False, "message": "nope"},
        False,
        "nope",
    ),
    ("health", 200, {"status": "ready"}, True, None),
    ("health", 503, {"status": "notready"}, False, "HTTP 503"),
    ("health", 200, {"status": "notready"}, False, "not 'ready'"),
]


@pytest.mark.parametrize(("path", "http", "body", "ok", "expect"), SIDECAR_CASES)
def test_sidecar_interpret(path, http, body, ok, expect):
    outcome = VLLM_SIDECAR.interpret(sidecar_call(path), http, body)
    assert outcome.ok is ok
    if ok:
        if isinstance(expect, dict):
            assert expect.items() <= outcome.data.items()
    else:
        assert expect in outcome.error


# ---- SGLang (§6) --------------------------------------------------------------------------


def test_sglang_builds():
    assert one(SGLANG, Op.PAUSE) == AdminCall(Op.PAUSE, "POST", "engine/pause_generation", {})
    assert one(SGLANG, Op.PAUSE, mode="retract").body == {"mode": "retract"}
    assert one(SGLANG, Op.RESUME).path == "engine/continue_generation"
    # The cache reset and the fate of paused requests are always explicit (§6, §9).
    assert one(SGLANG, Op.UPDATE_FROM_DISK, model_path="/m", weight_version="v1").body == {
        "model_path": "/m",
        "weight_version": "v1",
        "flush_cache": True,
        "abort_all_requests": True,
    }
    assert one(SGLANG, Op.SET_WEIGHT_VERSION, weight_version="v1") == AdminCall(
        Op.SET_WEIGHT_VERSION,
        "POST",
        "engine/control/update_weight_version",
        {"new_version": "v1", "abort_all_requests": False},
    )
    assert one(SGLANG, Op.LIVENESS).path == "health"
    assert SGLANG.update_invalidates_cache(Op.UPDATE_FROM_DISK)


SGLANG_CASES = [
    (Op.PAUSE, 200, {"status": "ok"}, True, None),
    (Op.RESUME, 200, {"status": "ok"}, True, None),
    (
        Op.RESUME,
        500,
        {
            "error": "Handler error",
            "message": "Python callback failed: ValueError: body must be an object",
        },
        False,
        "HTTP 500",
    ),
    (
        Op.UPDATE_FROM_DISK,
        200,
        {
            "success": True,
            "message": "Succeeded to update model weights.",
            "num_paused_requests": 0,
        },
        True,
        None,
    ),
    (
        Op.UPDATE_FROM_DISK,
        200,
        {"success": False, "message": "Failed to get weights iterator", "num_paused_requests": 0},
        False,
        "Failed to get weights iterator",
    ),
    (
        Op.UPDATE_FROM_DISK,
        500,
        {
            "error": "Handler error",
            "message": "Python callback failed: TypeError: unexpected keyword argument 'bogus'",
        },
        False,
        "unexpected keyword argument",
    ),
    (Op.UPDATE_FROM_DISK, 200, {"message": "no flag"}, False, "success=true"),
    (Op.UPDATE_FROM_DISTRIBUTED, 200, {"success": True, "message": "ok"}, True, None),
    (
        Op.SET_WEIGHT_VERSION,
        200,
        {"success": True, "message": "Weight version updated to v1", "new_version": "v1"},
        True,
        {"version": "v1"},
    ),
    (Op.SET_WEIGHT_VERSION, 200, {"success": False, "message": "bad"}, False, "bad"),
    (
        Op.INIT_WEIGHTS_GROUP,
        200,
        {"success": True, "message": "Succeeded to initialize custom process group."},
        True,
        None,
    ),
    (
        Op.INIT_WEIGHTS_GROUP,
        200,
        {"success": False, "message": "Failed to initialize"},
        False,
        "Failed to initialize",
    ),
    (Op.FLUSH_CACHE, 200, {"success": True}, True, None),
    (Op.FLUSH_CACHE, 200, {"result": False}, False, "not a success body"),
    (
        Op.GET_WEIGHT_VERSION,
        200,
        {"result": "v1"},
        True,
        {"version": "v1", "version_declared": True},
    ),
    (Op.GET_WEIGHT_VERSION, 200, {"other": 1}, False, "lacks a version"),
    (Op.LIVENESS, 200, {"status": "ready"}, True, None),
    (Op.LIVENESS, 503, {"status": "notready"}, False, "HTTP 503"),
]


@pytest.mark.parametrize(("op", "http", "body", "ok", "expect"), SGLANG_CASES)
def test_sglang_interpret(op, http, body, ok, expect):
    params = {
        Op.UPDATE_FROM_DISK: {"model_path": "/m"},
        Op.SET_WEIGHT_VERSION: {"weight_version": "v1"},
    }.get(op, {})
    outcome = SGLANG.interpret(one(SGLANG, op, **params), http, body)
    assert outcome.ok is ok
    if ok:
        if isinstance(expect, dict):
            assert expect.items() <= outcome.data.items()
    else:
        assert expect in outcome.error
