"""Every row of contract §1.6 plus the worker-side suffix rules."""

import pytest

from controlplane.dynamo.scope import (
    Scope,
    python_worker_namespace,
    resolve_scope,
    sidecar_namespace,
)

# Worker namespaces the contract used when observing the real listener.
WORKER_NAMESPACES = [
    "dynamo",
    "Dynamo",
    "dynamo-x",
    "dynamoz",
    "prod",
    "prod-a",
    "prod-a-gen2",
    "prod-a-a",
    "prodx",
    "side",
    "dyn",
]

# (frontend env, reported namespace, mode, workers matched among WORKER_NAMESPACES)
TABLE = [
    ({}, "dynamo", "exact", {"dynamo"}),
    ({"DYN_NAMESPACE": "dynamo"}, "dynamo", "exact", {"dynamo"}),
    (
        {"DYN_NAMESPACE_PREFIX": "prod"},
        "prod",
        "prefix",
        {"prod", "prod-a", "prod-a-gen2", "prod-a-a"},
    ),
    ({"DYN_NAMESPACE_PREFIX": "prod-a"}, "prod-a", "prefix", {"prod-a", "prod-a-gen2", "prod-a-a"}),
    ({"DYN_NAMESPACE_PREFIX": "prod-"}, "prod-", "prefix", set()),
    ({"DYN_NAMESPACE_PREFIX": "dyn"}, "dyn", "prefix", {"dyn"}),
    (
        {
            "DYN_NAMESPACE_PREFIX": "dynamo",
            "DYN_NAMESPACE": "prod",
            "DYN_NAMESPACE_WORKER_SUFFIX": "a",
        },
        "dynamo",
        "global",
        set(WORKER_NAMESPACES),
    ),
    ({"DYN_NAMESPACE_PREFIX": "", "DYN_NAMESPACE": "prod"}, "prod", "exact", {"prod"}),
    ({"DYN_NAMESPACE": "prod", "DYN_NAMESPACE_WORKER_SUFFIX": "a"}, "prod-a", "exact", {"prod-a"}),
    (
        {"DYN_NAMESPACE": "prod-a", "DYN_NAMESPACE_WORKER_SUFFIX": "a"},
        "prod-a-a",
        "exact",
        {"prod-a-a"},
    ),
    (
        {"DYN_NAMESPACE": "dynamo", "DYN_NAMESPACE_WORKER_SUFFIX": "x"},
        "dynamo-x",
        "exact",
        {"dynamo-x"},
    ),
    ({"DYN_NAMESPACE_WORKER_SUFFIX": "x"}, "dynamo-x", "exact", {"dynamo-x"}),
    ({"DYN_NAMESPACE": ""}, "dynamo", "exact", {"dynamo"}),
]


@pytest.mark.parametrize(("env", "reported", "mode", "matched"), TABLE)
def test_contract_table(env, reported, mode, matched):
    scope = Scope.from_env(env)
    assert scope.namespace == reported
    assert scope.mode == mode
    assert {ns for ns in WORKER_NAMESPACES if scope.matches(ns)} == matched


def test_dyn_prefix_does_not_match_dynamo():
    # The `dyn` row of the table: `dynamo` is not `dyn` followed by `-...`.
    scope = resolve_scope(prefix="dyn")
    assert not scope.matches("dynamo")
    assert not scope.matches("dynamo-x")


def test_trailing_hyphen_prefix_never_matches_generations():
    scope = resolve_scope(prefix="prod-")
    assert not scope.matches("prod-a")
    assert not scope.matches("prod")


def test_default_is_exact_not_global():
    scope = resolve_scope()
    assert scope == Scope("exact", "dynamo")
    assert not scope.is_global
    assert not scope.matches("Dynamo")  # case-sensitive


def test_global_flagged():
    scope = resolve_scope(prefix="dynamo", namespace="prod", worker_suffix="a")
    assert scope.is_global
    assert scope.matches("anything-at-all")
    assert "every namespace" in scope.explain()


def test_suffix_always_appended_by_listener():
    assert resolve_scope(namespace="prod-a", worker_suffix="a").namespace == "prod-a-a"


def test_prefix_wins_over_namespace_and_suffix():
    scope = resolve_scope(namespace="side", prefix="prod", worker_suffix="z")
    assert scope == Scope("prefix", "prod")


def test_explain_prefix():
    assert (
        resolve_scope(prefix="ns").explain()
        == "prefix `ns`: matches `ns` and `ns-*` generations, not `ns2`"
    )


def test_explain_exact_and_trailing_hyphen():
    assert resolve_scope(namespace="prod").explain().startswith("exact `prod`")
    assert "never matches" in resolve_scope(prefix="prod-").explain()


def test_unknown_mode_rejected():
    with pytest.raises(ValueError):
        Scope("fuzzy", "x")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("base", "suffix", "python", "sidecar"),
    [
        ("prod", "a", "prod-a", "prod-a"),
        ("prod-a", "a", "prod-a-a", "prod-a"),  # sidecar skips: suffix already present
        ("proda", "a", "proda-a", "proda-a"),  # not `-a`, so not "already present"
        ("prod", None, "prod", "prod"),
        ("prod", "", "prod", "prod"),
        (None, "x", "dynamo-x", "dynamo-x"),
        ("", None, "dynamo", "dynamo"),
    ],
)
def test_worker_side_suffix_rules(base, suffix, python, sidecar):
    assert python_worker_namespace(base, suffix) == python
    assert sidecar_namespace(base, suffix) == sidecar


def test_sidecar_suffix_mismatch_with_listener():
    # The contract's warning: a sidecar with NS=prod-a, SUFFIX=a is invisible to that listener.
    listener = resolve_scope(namespace="prod-a", worker_suffix="a")
    assert not listener.matches(sidecar_namespace("prod-a", "a"))
    assert listener.matches(python_worker_namespace("prod-a", "a"))
