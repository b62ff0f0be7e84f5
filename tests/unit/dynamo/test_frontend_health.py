"""A static worker's real identity, from the frontend's `/health` instances (contract §3)."""

from __future__ import annotations

import json

import pytest

from controlplane.dynamo.frontend_health import (
    FrontendHealthError,
    FrontendInstances,
    parse_frontend_health,
    resolve_identity,
)

# The shape Dynamo 1.6.1's frontend answers (observed, contract §3), ids past 2^63.
HEALTH = {
    "status": "healthy",
    "endpoints": ["dyn://rl-a.backend.generate"],
    "instances": [
        {
            "component": "backend",
            "endpoint": "generate",
            "namespace": "rl-a",
            "instance_id": 16486194599384006736,
            "transport": {"tcp": "10.0.0.5:34047/e4ca/rl-a/backend/generate"},
            "device_type": "cpu",
            "request_plane_codec": "json",
        },
        {
            "component": "backend",
            "endpoint": "generate",
            "namespace": "rl-a",
            "instance_id": 3918903858329359317,
            "transport": {"tcp": "10.0.0.6:34047/77aa/rl-a/backend/generate"},
        },
        {
            "component": "backend",
            "endpoint": "rl",
            "namespace": "rl-a",
            "instance_id": 16486194599384006736,
            "transport": {"tcp": "10.0.0.5:34047/e4ca/rl-a/backend/rl"},
        },
        {"component": "backend", "endpoint": "generate", "namespace": "rl-a", "instance_id": -1},
    ],
}


def listing(doc=HEALTH) -> FrontendInstances:
    return parse_frontend_health(json.dumps(doc).encode())


def resolve(**kw):
    values = {
        "name": "sgl-1",
        "namespace": "rl-a",
        "component": "backend",
        "endpoint": "generate",
        "system_url": "http://10.0.0.5:9090",
        "declared_id": "",
        "listing": listing(),
    }
    return resolve_identity(**{**values, **kw})


def test_instances_are_parsed_as_u64_and_a_bad_entry_is_named_not_dropped():
    parsed = listing()
    assert [i.instance_id for i in parsed.instances] == [
        16486194599384006736,
        3918903858329359317,
        16486194599384006736,
    ]
    assert parsed.rejected == ("instance #3: instance has no u64 'instance_id'",)
    assert parsed.instances[0].host == "10.0.0.5"


def test_a_health_body_without_instances_is_refused():
    with pytest.raises(FrontendHealthError, match="no 'instances' list"):
        parse_frontend_health(b'{"status":"healthy"}')


def test_the_request_plane_host_resolves_one_of_several_replicas():
    identity = resolve()
    assert identity.instance is not None and not identity.refusal
    assert identity.instance.instance_id == 16486194599384006736
    other = resolve(system_url="http://10.0.0.6:9090")
    assert other.instance is not None and other.instance.instance_id == 3918903858329359317


def test_an_ambiguous_match_is_refused_naming_the_candidates():
    identity = resolve(system_url="http://10.0.0.9:9090")
    assert identity.instance is None
    assert "static worker sgl-1: ambiguous identity, 2 instances of rl-a/backend/generate" in (
        identity.refusal
    )
    assert "16486194599384006736" in identity.refusal and "declare its instance id" in (
        identity.refusal
    )


def test_a_declared_id_must_be_registered():
    ok = resolve(system_url="http://10.0.0.9:9090", declared_id="3918903858329359317")
    assert ok.instance is not None and ok.instance.instance_id == 3918903858329359317
    bad = resolve(declared_id="42")
    assert bad.instance is None
    assert bad.refusal.startswith(
        "static worker sgl-1: declared instance id 42 is not registered at the frontend"
    )


def test_a_worker_the_frontend_does_not_list_has_an_unknown_identity_not_an_invented_one():
    identity = resolve(component="sglang")
    assert identity.instance is None and not identity.refusal
    assert (
        identity.note == "identity unknown: the frontend lists no instance of rl-a/sglang/generate"
    )
    no_frontend = resolve(listing=None)
    assert no_frontend.note.startswith("identity unknown: the source has no frontend URL")
    unreadable = resolve(listing=None, unavailable="frontend /health answered HTTP 503")
    assert unreadable.note == "identity unknown: frontend /health answered HTTP 503"


def test_a_declared_id_that_cannot_be_checked_is_refused():
    identity = resolve(listing=None, declared_id="42", unavailable="frontend /health timed out")
    assert identity.instance is None
    assert "declared instance id 42 cannot be checked (frontend /health timed out)" in (
        identity.refusal
    )
