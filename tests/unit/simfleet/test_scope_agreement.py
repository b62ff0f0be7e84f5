"""The client's scope rules and the simulator's, written apart from the contract, must agree.

Each side is tested alone against the contract's table elsewhere (tests/unit/dynamo/test_scope.py
and the simulated listener's integration tests); here hypothesis searches for any environment and
worker namespace on which the two disagree.
"""

from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.dynamo.scope import Scope
from controlplane.simfleet.scope import listener_scope

# Names built from the characters that matter to the rules: the global name, hyphens, case.
_parts = st.sampled_from(["dynamo", "Dynamo", "dyn", "prod", "a", "x", "gen2", "-", ""])
_names = st.lists(_parts, max_size=4).map("".join)
_env_value = st.one_of(st.none(), _names)


@st.composite
def _env(draw):
    env = {}
    for key in ("DYN_NAMESPACE", "DYN_NAMESPACE_PREFIX", "DYN_NAMESPACE_WORKER_SUFFIX"):
        value = draw(_env_value)
        if value is not None:
            env[key] = value
    return env


@settings(max_examples=3000, deadline=None)
@given(env=_env(), namespace=_names)
def test_client_and_simulator_agree_on_scope(env, namespace):
    client = Scope.from_env(env)
    simulator = listener_scope(env)
    assert client.namespace == simulator.reported
    assert client.matches(namespace) == simulator.matches(namespace)


def test_contract_table_on_the_simulator():
    """The rows of contract §1.6 that distinguish the modes."""
    cases = [
        ({}, "dynamo", {"dynamo"}, {"Dynamo", "dynamo-x", "dynamoz"}),
        ({"DYN_NAMESPACE_PREFIX": "prod"}, "prod", {"prod", "prod-a", "prod-a-gen2"}, {"prodx"}),
        ({"DYN_NAMESPACE_PREFIX": "prod-"}, "prod-", set(), {"prod-a", "prod"}),
        ({"DYN_NAMESPACE_PREFIX": "dyn"}, "dyn", set(), {"dynamo"}),
        (
            {"DYN_NAMESPACE_PREFIX": "dynamo", "DYN_NAMESPACE": "prod"},
            "dynamo",
            {"prod", "prodx", "Dynamo", "side"},
            set(),
        ),
        ({"DYN_NAMESPACE_PREFIX": "", "DYN_NAMESPACE": "prod"}, "prod", {"prod"}, {"prod-a"}),
        (
            {"DYN_NAMESPACE": "prod-a", "DYN_NAMESPACE_WORKER_SUFFIX": "a"},
            "prod-a-a",
            {"prod-a-a"},
            {"prod-a"},
        ),
        ({"DYN_NAMESPACE_WORKER_SUFFIX": "x"}, "dynamo-x", {"dynamo-x"}, {"dynamo"}),
    ]
    for env, reported, matched, unmatched in cases:
        scope = listener_scope(env)
        assert scope.reported == reported, env
        assert all(scope.matches(ns) for ns in matched), env
        assert not any(scope.matches(ns) for ns in unmatched), env
