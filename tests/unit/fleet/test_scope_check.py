"""The declared listener scope: who is refused, and why (integration reference, contract §1.6)."""

from __future__ import annotations

import pytest

from controlplane.fleet.declared_scope import DeclaredScope, unconfirmed_other_deployments
from controlplane.fleet.discovery.rejections import Rejection, blocker_text, blocking


@pytest.mark.parametrize(
    ("declared", "namespace", "refused"),
    [
        (DeclaredScope("exact", "prod"), "prod", False),
        (DeclaredScope("exact", "prod"), "prod-a", True),
        # An empty DYN_NAMESPACE is the empty namespace, not `dynamo`.
        (DeclaredScope("exact", ""), "", False),
        (DeclaredScope("exact", ""), "dynamo", True),
        (DeclaredScope("prefix", prefix="prod"), "prod-a-gen2", False),
        (DeclaredScope("prefix", prefix="prod"), "prodx", True),
        (DeclaredScope("suffix", "prod", suffix="a"), "prod-a", False),
        (DeclaredScope("suffix", "prod", suffix="a"), "prod", True),
        (DeclaredScope("global"), "someone-else", False),
    ],
)
def test_workers_outside_the_declared_scope_are_refused(declared, namespace, refused):
    reason = declared.refusal(namespace, reported="whatever")
    assert bool(reason) is refused
    if refused:
        assert f"namespace {namespace!r} is not matched" in reason


def test_an_undeclared_global_listener_is_refused_by_name():
    undeclared = DeclaredScope("")
    assert undeclared.refusal("rl-a", reported="rl") == ""
    reason = undeclared.refusal("other-team", reported="dynamo")
    assert "global scope (DYN_NAMESPACE_PREFIX=dynamo" in reason
    assert "'other-team'" in reason and "does not declare a global scope" in reason
    # The `dynamo` namespace itself is what an exact default listener reports too.
    assert undeclared.refusal("dynamo", reported="dynamo") == ""


def test_own_deployment_under_a_global_scope():
    scope = DeclaredScope("global", "prod")
    assert scope.own_deployment("prod") and scope.own_deployment("prod-abc123")
    assert not scope.own_deployment("prodx") and not scope.own_deployment("team-b")


def test_a_rejected_entry_blocks_its_namespace_and_an_unreadable_one_blocks_all():
    entries = [
        {"index": 0, "reason": "instance_id is not a u64", "raw": {"namespace": "rl-a"}},
        {"index": 4, "reason": "entry is not an object", "raw": [1, 2]},
    ]
    assert [r.index for r in blocking(entries[:1], ["rl-b"])] == []
    assert [r.index for r in blocking(entries[:1], ["rl-a"])] == [0]
    assert [r.index for r in blocking(entries, ["rl-b"])] == [4]
    text = blocker_text(blocking(entries, None))
    assert text.startswith("the listing is partial")
    assert "listener entry #0 in namespace 'rl-a' rejected: instance_id is not a u64" in text
    assert "listener entry #4, namespace unreadable, rejected: entry is not an object" in text
    assert blocker_text([]) == ""
    assert Rejection.of(entries[0]).namespace == "rl-a"


def test_a_global_plan_must_name_other_deployments_to_pause_them():
    scope = DeclaredScope("global", "prod")
    workers = ["prod", "prod-abc", "team-b", "team-b", "team-c"]
    blocker = unconfirmed_other_deployments(scope, workers, None)
    assert blocker.endswith(
        "would pause workers of team-b (2 workers), team-c (1 workers); name these "
        "namespaces in the plan to confirm"
    )
    assert "team-c" in unconfirmed_other_deployments(scope, workers, ["team-b"])
    assert unconfirmed_other_deployments(scope, workers, ["prod", "team-b", "team-c"]) == ""
    assert unconfirmed_other_deployments(DeclaredScope("prefix", prefix="x"), workers, None) == ""
