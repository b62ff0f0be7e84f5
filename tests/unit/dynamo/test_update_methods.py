# ruff: noqa: E501  (Dynamo's messages are quoted verbatim)
"""Update methods per family, LoRA and sidecar state replies, and SGLang's route grammar."""

import pytest

from controlplane.dynamo.families import (
    SGLANG,
    VLLM_SIDECAR,
    VLLM_WORKER,
    AdminCall,
    Operation,
    UpdateMethod,
    negotiate,
    offered_methods,
)
from controlplane.dynamo.families.sglang_routes import parse_engine_routes, route_bindings
from tests.unit.dynamo.test_families import SIDECAR_ADVERTISED, VLLM_ADVERTISED

LORA = [*VLLM_ADVERTISED, "load_lora", "unload_lora"]


def test_each_family_offers_the_methods_its_routes_allow():
    # `external` needs no update route: the trainer's framework applies the weights itself.
    assert offered_methods(VLLM_WORKER, LORA, static=False) == [
        "disk",
        "distributed",
        "lora",
        "external",
    ]
    assert offered_methods(VLLM_SIDECAR, SIDECAR_ADVERTISED, static=False) == [
        "distributed",
        "external",
    ]
    sglang = ["control/update_weights_from_disk", "control/update_weights_from_tensor"]
    assert offered_methods(SGLANG, sglang, static=True) == ["disk", "tensor", "external", "custom"]


def test_the_reason_names_the_routes_and_a_refusal_names_the_contract():
    deal = negotiate(VLLM_WORKER, UpdateMethod.LORA, LORA, lora_action="swap")
    assert deal.ok and deal.reason == "vllm advertises load_lora, set_weight_version"
    assert deal.operations == (Operation.SWAP_LORA, Operation.SET_WEIGHT_VERSION)
    tensor = negotiate(VLLM_WORKER, UpdateMethod.TENSOR, VLLM_ADVERTISED)
    assert not tensor.ok and "always answers 'not implemented'" in tensor.reason
    no_lora = negotiate(VLLM_WORKER, UpdateMethod.LORA, VLLM_ADVERTISED)
    assert (
        no_lora.reason == "vllm LoRA adapter needs load_lora, which the worker does not advertise"
    )


def test_a_custom_route_needs_a_static_worker_that_allowlists_it():
    assert not negotiate(VLLM_WORKER, UpdateMethod.CUSTOM, ["x"], custom_route="x").ok
    assert not negotiate(SGLANG, UpdateMethod.CUSTOM, ["y"], static=True, custom_route="x").ok
    deal = negotiate(SGLANG, UpdateMethod.CUSTOM, ["x"], static=True, custom_route="x")
    assert deal.ok and deal.reason == "sglang allowlists x"


def lora_call(op=Operation.LOAD_LORA):
    return AdminCall(op, "POST", "engine/load_lora", {})


@pytest.mark.parametrize(
    ("op", "body", "ok", "error"),
    [
        (
            Operation.LOAD_LORA,
            {
                "status": "success",
                "message": "LoRA adapter 'a' loaded successfully",
                "hot_swap": False,
            },
            True,
            None,
        ),
        # A load of a loaded name is Dynamo's idempotent no-op: fine for a load (retry-safe)...
        (
            Operation.LOAD_LORA,
            {"status": "success", "message": "LoRA adapter 'a' already loaded", "hot_swap": False},
            True,
            None,
        ),
        # ...but a swap that did not swap fails.
        (
            Operation.SWAP_LORA,
            {"status": "success", "message": "LoRA adapter 'a' already loaded", "hot_swap": False},
            False,
            "load_lora did not hot-swap the adapter (is DYN_LORA_HOTSWAP_ENABLED set on the worker?): \"LoRA adapter 'a' already loaded\"",
        ),
        (
            Operation.SWAP_LORA,
            {
                "status": "success",
                "message": "LoRA adapter 'a' hot-swapped successfully",
                "hot_swap": True,
            },
            True,
            None,
        ),
        (
            Operation.LOAD_LORA,
            {"status": "ok"},
            False,
            "expected status 'success' from load_lora, got 'ok'",
        ),
        (
            Operation.LOAD_LORA,
            {
                "status": "error",
                "message": "LoRA capacity exceeded: at most 1 adapter(s) may be loaded",
                "lora_name": "b",
            },
            False,
            "LoRA capacity exceeded: at most 1 adapter(s) may be loaded",
        ),
    ],
)
def test_lora_replies(op, body, ok, error):
    outcome = VLLM_WORKER.interpret(lora_call(op), 200, body)
    assert (outcome.ok, outcome.error) == (ok, error)


@pytest.mark.parametrize(
    ("route", "body", "ok"),
    [
        ("control/is_paused", {"is_paused": False}, True),
        ("control/is_paused", {"is_paused": True}, False),
        ("control/is_sleeping", {"is_sleeping": True}, False),
        ("control/is_sleeping", {}, False),
        ("control/wake_up", {"status": "partially_awake", "is_sleeping": True}, False),
        ("control/wake_up", {"status": "awake"}, True),
        ("control/sleep", {"status": "sleeping"}, True),
    ],
)
def test_sidecar_state_replies(route, body, ok):
    op = {
        "control/is_paused": Operation.IS_PAUSED,
        "control/is_sleeping": Operation.IS_SLEEPING,
        "control/wake_up": Operation.WAKE_UP,
        "control/sleep": Operation.SLEEP,
    }[route]
    assert VLLM_SIDECAR.interpret(AdminCall(op, "POST", f"engine/{route}", {}), 200, body).ok is ok


def test_sglang_success_is_judged_with_the_http_status():
    call = AdminCall(
        Operation.UPDATE_FROM_DISK, "POST", "engine/control/update_weights_from_disk", {}
    )
    assert SGLANG.interpret(call, 200, {"success": True, "message": "ok"}).ok
    assert (
        SGLANG.interpret(call, 200, {"success": False, "message": "bad path"}).error == "bad path"
    )
    failed = SGLANG.interpret(
        call, 500, {"error": "Handler error", "message": "Python callback failed: TypeError: x"}
    )
    assert failed.error == "HTTP 500: Handler error: Python callback failed: TypeError: x"


def test_sglang_pause_modes_and_auto_default():
    assert SGLANG.pause_mode_for("auto") == "abort"
    assert SGLANG.pause_mode_for("retract") == "retract"
    with pytest.raises(
        ValueError, match="sglang has no pause mode 'keep'; choose one of abort, retract, in_place"
    ):
        SGLANG.pause_mode_for("keep")
    # Drain, not vLLM's own keep (docs/reference/in-flight-requests.md).
    assert VLLM_WORKER.pause_mode_for("auto") == "wait"
    assert VLLM_SIDECAR.pause_mode_for("auto") == "wait"


@pytest.mark.parametrize(
    ("descriptors", "message"),
    [
        (
            "x:gpu",
            "Invalid SGLang engine route descriptor 'x:gpu': unknown target 'gpu'; expected 'engine' or 'tm'",
        ),
        (
            "p=_priv",
            "Invalid SGLang engine route descriptor 'p=_priv': private methods cannot be exposed",
        ),
        (
            "dup dup",
            "Invalid SGLang engine route descriptor 'dup': route path 'dup' is configured more than once",
        ),
        (
            "a:b:c",
            "Invalid SGLang engine route descriptor 'a:b:c': expected at most one ':' target separator",
        ),
        (
            "a=b=c",
            "Invalid SGLang engine route descriptor 'a=b=c': expected at most one '=' method separator",
        ),
        (
            "_priv",
            "Invalid SGLang engine route descriptor '_priv': the route path must contain non-empty '/'-separated segments using only letters, digits, '.', '_', and '-'",
        ),
        (
            "a//b",
            "Invalid SGLang engine route descriptor 'a//b': the route path must contain non-empty '/'-separated segments using only letters, digits, '.', '_', and '-'",
        ),
        (
            "p=1x",
            "Invalid SGLang engine route descriptor 'p=1x': method '1x' is not a Python identifier",
        ),
        (
            "control/update_weight_version=update_weight_version",
            "Configured SGLang engine route /engine/control/update_weight_version collides with a built-in route",
        ),
    ],
)
def test_the_engine_route_grammar_refuses_like_dynamo(descriptors, message):
    with pytest.raises(ValueError) as raised:
        parse_engine_routes(descriptors)
    assert str(raised.value) == message


def test_the_engine_route_grammar_parses_paths_methods_and_targets():
    routes = parse_engine_routes(
        "flush=flush_cache pause_generation:tm weights/version=get_weight_version:engine"
    )
    assert [(r.path, r.method, r.target) for r in routes] == [
        ("flush", "flush_cache", "engine"),
        ("pause_generation", "pause_generation", "tm"),
        ("weights/version", "get_weight_version", "engine"),
    ]
    paths, methods = route_bindings(
        ["continue_generation", "flush=flush_cache", "pause_generation:tm"]
    )
    assert paths == ["continue_generation", "flush", "pause_generation"]
    assert methods == {"flush_cache": "flush"}
    bound = SGLANG.bound(methods)
    (call,) = bound.build(Operation.FLUSH_CACHE)
    assert call.path == "engine/flush"
    assert bound.interpret(call, 200, {"success": True}).ok
