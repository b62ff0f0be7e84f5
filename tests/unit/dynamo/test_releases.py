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
