"""Dynamo releases as data: each source's release has a contract, and what differs is listed."""

from __future__ import annotations

import pytest

from controlplane.dynamo.releases import DEFAULT_RELEASE, RELEASES, contract, differences


def test_blank_is_the_default_release_and_unknown_ones_are_refused_by_name():
    assert DEFAULT_RELEASE == "1.6.1"
    assert contract("").name == "1.6.1"
    with pytest.raises(ValueError, match=r"unknown Dynamo release '1\.8'; known: 1\.6\.1, 1\.7"):
        contract("1.8")


def test_what_changed_after_161_is_listed():
    changed = {surface for surface, _, _ in differences("1.6.1", "1.7")}
    assert {
        "vllm_version_declared_rule",
        "vllm_update_without_version",
        "sidecar_extra_args",
        "sglang_native_routes",
        "group_init_timeout",
    } <= changed
    assert "verified" not in changed
    assert RELEASES["1.7"].sidecar_extra_args.startswith("rejected")


def test_the_adapters_are_built_from_each_release_contract():
    from controlplane.dynamo.families import FAMILIES, Operation, for_release

    assert for_release("vllm") is FAMILIES["vllm"]
    assert for_release("vllm", "1.7") is not FAMILIES["vllm"]
    assert for_release("vllm", "1.7") is for_release("vllm", "1.7")  # built once
    for name in ("vllm", "vllm-sidecar", "sglang"):
        family = for_release(name, "1.7")
        assert family.release.name == "1.7"
    rules = RELEASES["1.7"].rules
    sidecar = for_release("vllm-sidecar", "1.7")
    assert sidecar.routes[Operation.UPDATE_FROM_DISTRIBUTED] == frozenset(
        rules.sidecar_routes["update_from_distributed"]
    )
    sglang = for_release("sglang", "1.7")
    (update,) = sglang.build(Operation.UPDATE_FROM_DISK, model_path="/m", weight_version="v")
    assert update.body["keep_pause"] is True
    (old,) = FAMILIES["sglang"].build(Operation.UPDATE_FROM_DISK, model_path="/m")
    assert "keep_pause" not in old.body
    assert sglang.gone_routes(["control/release_memory_occupation", "pause_generation"]) == [
        "control/release_memory_occupation"
    ]
    assert FAMILIES["sglang"].gone_routes(["control/release_memory_occupation"]) == []


def test_vllm_version_declared_is_read_per_release():
    from controlplane.dynamo.families import FAMILIES, Operation, for_release
    from controlplane.dynamo.releases import declared_ok, readback_rule

    untracked = {"status": "ok", "version": "v2"}
    for_161 = FAMILIES["vllm"]
    (call,) = for_161.build(Operation.GET_WEIGHT_VERSION)
    assert not for_161.interpret(call, 200, untracked).ok
    outcome = for_release("vllm", "1.7").interpret(call, 200, untracked)
    assert outcome.ok and outcome.data["version_declared"] is None  # not tracked, not false

    assert readback_rule("", "vllm", ["set_weight_version"]) == "required"
    assert readback_rule("1.7", "vllm", ["set_weight_version"]) == "trusted"
    assert readback_rule("1.7", "vllm", ["get_weight_version"]) == "ignored"
    assert readback_rule("1.7", "sglang", []) == "required"
    assert [declared_ok("required", d) for d in (True, False, None)] == [True, False, False]
    assert [declared_ok("trusted", d) for d in (True, False, None)] == [True, False, True]
    assert [declared_ok("ignored", d) for d in (True, False, None)] == [True, True, True]
