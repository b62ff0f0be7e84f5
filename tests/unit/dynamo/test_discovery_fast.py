"""The listing's fast path agrees with the detailed validator: whatever it accepts, the detailed
validator accepts identically (no rejected entry), and a real listener's listing takes it.

Differential: the same generated bodies (hostile and well-formed, from
test_discovery_hostile.py) go through both; the fast path may give up on anything, but a result
it returns must be exactly the detailed one.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.dynamo import discovery_fast
from controlplane.dynamo.discovery import MAX_DISCOVERY_BYTES, _parse_detailed, parse_discovery
from controlplane.dynamo.discovery_fast import parse_well_formed
from controlplane.dynamo.errors import DiscoveryError
from tests.conftest import examples
from tests.unit.dynamo.test_discovery_hostile import (
    _one,
    hostile_body,
    sweep_bodies,
    sweep_entries,
    to_json,
    valid_entries,
)

#: Generated bodies per property per CI run (HYPOTHESIS_PROFILE=deep: the soak count); every
#: table entry of the hostile generator also goes through both parsers in the sweep below.
EXAMPLES = examples(ci=1_500, deep=6_000)


def _detailed(body):
    try:
        return _parse_detailed(body)
    except DiscoveryError as exc:
        return exc


def _agrees(body) -> bool:
    """True when the fast path took `body`; fails when it took it and the detailed validator
    refused it, rejected an entry, or read it differently."""
    fast = parse_well_formed(body, max_bytes=MAX_DISCOVERY_BYTES)
    if fast is None:
        return False
    detailed = _detailed(body)
    assert not isinstance(detailed, DiscoveryError), (body, detailed)
    assert detailed.rejected == (), (body, detailed.rejected)
    assert fast == detailed, body
    return True


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(hostile_body())
def test_fast_path_accepts_nothing_the_detailed_validator_refuses(body):
    _agrees(body)


def test_fast_path_agrees_on_every_swept_body():
    """Every hostile table entry, as a whole body and inside an entry, through both parsers."""
    bodies = sweep_bodies()
    bodies += [
        to_json(
            {"protocol_version": 1, "namespace": "rl", "workers": [entry, _one(instance_id=8)]},
            False,
        )
        for _field, _value, entry in sweep_entries()
    ]
    taken = sum(_agrees(body) for body in bodies)
    assert 0 < taken < len(bodies)


@st.composite
def well_formed_body(draw) -> bytes | str:
    entries = draw(st.lists(valid_entries, min_size=0, max_size=6))
    text = to_json(
        {"protocol_version": 1, "namespace": "rl", "workers": entries},
        ascii_only=draw(st.booleans()),
    )
    return text.encode("utf-8", "surrogatepass") if draw(st.booleans()) else text


def test_fast_path_takes_well_formed_listings():
    taken = {"fast": 0, "all": 0}

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(well_formed_body())
    def check(body):
        taken["all"] += 1
        taken["fast"] += _agrees(body)

    check()
    # Most well-formed listings are taken (it gives up on a repeated identity, escapes, ...).
    assert taken["fast"] > taken["all"] // 2, taken


def _listing(workers: int = 50) -> dict:
    entries = [
        {
            "namespace": f"rl-{i % 2}",
            "component": "backend",
            "endpoint": "rl",
            "instance_id": 2**64 - 1 - i,
            "transport": {"tcp": f"127.0.0.1:9/{i:x}/rl-{i % 2}/backend/rl"},
            "request_plane_url": f"dyn://rl-{i % 2}.backend.rl",
            "system_url": f"http://127.0.0.1:9000/w/{i:x}",
            "model": "sim-model",
            "routes": ["get_weight_version", "liveness_probe", "pause_generation"],
            "world_size": 1,
        }
        for i in range(workers)
    ]
    return {"protocol_version": 1, "namespace": "rl", "workers": entries}


def test_a_listener_listing_takes_the_fast_path_with_exact_u64_ids():
    doc = _listing()
    body = json.dumps(doc, separators=(",", ":")).encode()
    result = parse_well_formed(body, max_bytes=MAX_DISCOVERY_BYTES)
    assert result is not None and result == _parse_detailed(body)
    assert result.workers[0].identity.instance_id == 2**64 - 1  # exact, past 2^63 and 2^53
    assert parse_discovery(body) == result


@pytest.mark.parametrize(
    "edit",
    [
        # A repeated key: plain json.loads would keep the last value silently.
        lambda t: t.replace('"model":"sim-model"', '"model":"sim-model","model":"other"', 1),
        lambda t: t.replace('"protocol_version":1', '"protocol_version":1,"protocol_version":1'),
        lambda t: t.replace('{"tcp":', '{"tcp":"x","tcp":', 1),
        # The same with a backslash in the body (the decoder's hook path).
        lambda t: t.replace('"model":"sim-model"', '"model":"a\\\\b","model":"other"', 1),
        # Payload-wide problems inside an entry the fast path does not know.
        lambda t: t.replace('"world_size":1', '"world_size":1,"future":NaN', 1),
        lambda t: t.replace('"world_size":1', '"world_size":1e400', 1),
        lambda t: t.replace('"world_size":1', '"world_size":' + "9" * 41, 1),
        lambda t: t.replace('"world_size":1', '"world_size":null', 1),
        lambda t: t.replace('"world_size":1', '"world_size":true', 1),
        lambda t: t.replace('"world_size":1', '"world_size":0', 1),
        lambda t: t.replace('"system_url":"http://127.0.0.1:9000', '"system_url":"ftp://x', 1),
        lambda t: t.replace('"system_url":"http://127.0.0.1:9000', '"system_url":"http://[::1', 1),
        lambda t: t.replace(
            '"system_url":"http://127.0.0.1:9000', '"system_url":"http://h:99999', 1
        ),
        lambda t: t.replace('"pause_generation"', '""', 1),
        lambda t: t.replace('"pause_generation"', "7", 1),
        lambda t: t.replace('"pause_generation"', '["x"]', 1),
        lambda t: t.replace('"sim-model"', '"a\\u0000b"', 1),
        lambda t: t.replace('"sim-model"', '"\\ud800"', 1),
        lambda t: t.replace(
            '"instance_id":18446744073709551615', '"instance_id":18446744073709551616'
        ),
        lambda t: t.replace('"instance_id":18446744073709551615', '"instance_id":-1'),
        lambda t: t.replace('"instance_id":18446744073709551615', '"instance_id":1.0'),
        lambda t: t.replace('{"tcp":"', '{"tcp":{"deep":"', 1).replace('/rl"}', '/rl"}}', 1),
        lambda t: t.replace('{"tcp":"', '{"tcp":"' + "x" * 2100, 1),
        lambda t: t.replace('"routes":', '"routes":[],"r2":', 1),
    ],
)
def test_anything_unusual_leaves_the_fast_path(edit):
    body = edit(json.dumps(_listing(3), separators=(",", ":"))).encode()
    assert body != json.dumps(_listing(3), separators=(",", ":")).encode()
    assert parse_well_formed(body, max_bytes=MAX_DISCOVERY_BYTES) is None
    # The detailed validator decides (refusal, rejected entry, or a shape only it reads).
    detailed = _detailed(body)
    if not isinstance(detailed, DiscoveryError):
        assert parse_discovery(body) == detailed


def test_a_repeated_worker_leaves_the_fast_path():
    doc = _listing(3)
    doc["workers"].append(dict(doc["workers"][0]))
    body = json.dumps(doc).encode()
    assert parse_well_formed(body, max_bytes=MAX_DISCOVERY_BYTES) is None
    assert len(parse_discovery(body).rejected) == 1


def test_system_url_verdicts_are_shared_per_origin_only_for_plain_urls(monkeypatch):
    judged: list[str] = []
    real = discovery_fast.system_url_problem

    def counting(url):
        judged.append(url)
        return real(url)

    monkeypatch.setattr(discovery_fast, "system_url_problem", counting)
    assert (
        parse_well_formed(json.dumps(_listing(40)).encode(), max_bytes=MAX_DISCOVERY_BYTES)
        is not None
    )
    assert judged == ["http://127.0.0.1:9000"]  # 40 workers, one origin


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-32"])
def test_a_repeated_key_in_a_utf16_or_utf32_body_leaves_the_fast_path(encoding):
    # Quote bytes are only quotes in UTF-8: U+2200 is 0x00 0x22 in UTF-16-LE.
    text = json.dumps(_listing(2), separators=(",", ":"), ensure_ascii=False)
    text = text.replace('"model":"sim-model"', '"model":"\u2200\u2200","model":"other"', 1)
    body = text.encode(encoding)
    assert parse_well_formed(body, max_bytes=MAX_DISCOVERY_BYTES) is None
    assert len(parse_discovery(body).rejected) == 1
    # Without the repeat, the same encoding is still parsed (by the hook path).
    plain = json.dumps(_listing(2), separators=(",", ":")).encode(encoding)
    assert parse_well_formed(plain, max_bytes=MAX_DISCOVERY_BYTES) == _parse_detailed(plain)
