import json

import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.dynamo import discovery
from controlplane.dynamo.discovery import (
    MAX_DISCOVERY_BYTES,
    DiscoveryResult,
    WorkerIdentity,
    fetch_discovery,
    parse_discovery,
)
from controlplane.dynamo.errors import DiscoveryError, ProtocolVersionError
from controlplane.dynamo.policy import OutboundPolicy

from .conftest import drop_connection

BIG_ID = 16486194599384006736  # > 2^63, from a real 1.6.1 run


def entry(**overrides):
    base = {
        "namespace": "dynamo",
        "component": "backend",
        "endpoint": "rl",
        "instance_id": BIG_ID,
        "transport": {"tcp": "127.0.0.1:34047/e4ca/dynamo/backend/rl"},
        "request_plane_url": "dyn://dynamo.backend.rl",
        "routes": ["get_weight_version", "pause_generation", "resume_generation"],
        "system_url": "http://127.0.0.1:9090",
        "world_size": 1,
    }
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not _DROP}


_DROP = object()


def payload(*entries, version=1, namespace="dynamo"):
    return json.dumps(
        {"protocol_version": version, "namespace": namespace, "workers": list(entries)}
    )


ERROR_ENTRY = (
    '{"namespace":"dynamo","component":"slow","endpoint":"rl","instance_id":3918903858329359317,'
    '"transport":{"tcp":"127.0.0.1:36345/3662be4bc0a113d5/dynamo/slow/rl"},'
    '"request_plane_url":"dyn://dynamo.slow.rl","routes":[],'
    '"error":"worker discovery timed out after 30s"}'
)


def test_parses_full_entry_and_big_instance_id_exactly():
    result = parse_discovery(payload(entry(model="Qwen/Qwen3-0.6B")))
    assert result.protocol_version == 1 and result.namespace == "dynamo"
    (worker,) = result.workers
    assert worker.identity == WorkerIdentity("dynamo", "backend", "rl", BIG_ID)
    assert worker.identity.instance_id == BIG_ID  # exact, not a float round-trip
    assert worker.key == f"dynamo/backend/rl/{BIG_ID}"
    assert worker.routes == ("get_weight_version", "pause_generation", "resume_generation")
    assert worker.model == "Qwen/Qwen3-0.6B"
    assert worker.world_size == 1
    assert worker.available


def test_instance_id_at_u64_max_from_raw_text():
    text = payload(entry()).replace(str(BIG_ID), str(2**64 - 1))
    assert parse_discovery(text.encode()).workers[0].identity.instance_id == 2**64 - 1


def test_omitted_optional_fields_stay_none():
    worker = parse_discovery(
        payload(entry(system_url=_DROP, world_size=_DROP, routes=["pause_generation"]))
    ).workers[0]
    assert worker.system_url is None
    assert worker.admin_base_url is None
    assert worker.model is None
    assert worker.world_size is None
    assert worker.error is None


def test_error_entry_is_kept_as_unavailable():
    body = '{"protocol_version":1,"namespace":"dynamo","workers":[' + ERROR_ENTRY + "]}"
    (worker,) = parse_discovery(body).workers
    assert worker.error == "worker discovery timed out after 30s"
    assert worker.routes == ()
    assert not worker.available
    assert worker.identity.instance_id == 3918903858329359317


def test_empty_worker_list_is_valid():
    result = parse_discovery(payload())
    assert result == DiscoveryResult(1, "dynamo", (), ())


def test_unknown_keys_are_ignored():
    result = parse_discovery(payload(entry(future_field={"x": 1})))
    assert len(result.workers) == 1 and not result.rejected


def test_admin_base_url_trailing_slash_kept():
    worker = parse_discovery(payload(entry(admin_base_url="http://10.0.0.5:8000/"))).workers[0]
    assert worker.admin_base_url == "http://10.0.0.5:8000/"


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"instance_id": -1}, "outside the unsigned 64-bit range"),
        ({"instance_id": 2**64}, "outside the unsigned 64-bit range"),
        ({"instance_id": True}, "unsigned 64-bit integer"),
        ({"instance_id": 1.0}, "unsigned 64-bit integer"),
        ({"instance_id": str(BIG_ID)}, "unsigned 64-bit integer"),
        ({"instance_id": _DROP}, "missing 'instance_id'"),
        ({"namespace": 7}, "'namespace' must be a string"),
        ({"component": ""}, "'component' must not be empty"),
        ({"endpoint": _DROP}, "missing 'endpoint'"),
        ({"transport": "tcp"}, "'transport' must be a non-empty object"),
        ({"request_plane_url": None}, "'request_plane_url' must be a string"),
        ({"routes": "pause_generation"}, "'routes' must be an array"),
        ({"routes": _DROP}, "missing 'routes'"),
        ({"routes": ["ok", 3]}, "non-string"),
        ({"routes": ["ok", ""]}, "empty entry"),
        ({"system_url": None}, "null"),
        ({"system_url": 5}, "'system_url' must be a string"),
        ({"system_url": "ftp://h:1"}, "system_url must use HTTP or HTTPS"),
        ({"model": None}, "'model' is null"),
        ({"model": 3}, "'model' must be a string"),
        ({"world_size": 0}, "'world_size'"),
        ({"world_size": "2"}, "'world_size'"),
        ({"world_size": 2.0}, "'world_size'"),
        ({"world_size": True}, "'world_size'"),
        ({"world_size": 4294967296}, "'world_size'"),
        ({"error": 500}, "'error' must be a string"),
        ({"admin_base_url": 42}, "'admin_base_url' must be a string"),
        ({"admin_base_url": "   "}, "must not be blank"),
        ({"admin_base_url": "ftp://h/"}, "must use HTTP or HTTPS and include a host"),
        ({"admin_base_url": "http://"}, "must use HTTP or HTTPS and include a host"),
        ({"admin_base_url": "http://u:p@h/"}, "must not include user information"),
        ({"admin_base_url": "http://h/?a=1"}, "must not include a query string"),
        ({"admin_base_url": "http://h/#frag"}, "must not include a fragment"),
    ],
)
def test_malformed_entry_is_rejected_without_poisoning_others(overrides, reason):
    good = entry(component="good")
    bad = (
        entry(component="bad", **overrides) if "component" not in overrides else entry(**overrides)
    )
    result = parse_discovery(payload(good, bad))
    assert [w.identity.component for w in result.workers] == ["good"]
    (rejected,) = result.rejected
    assert rejected.index == 1
    assert reason in rejected.reason
    assert rejected.raw == json.loads(json.dumps(bad))


def test_non_object_entry_rejected():
    result = parse_discovery(payload(entry(), [1, 2], "x"))
    assert len(result.workers) == 1
    assert [r.index for r in result.rejected] == [1, 2]
    assert "entry must be an object" in result.rejected[0].reason


def test_duplicate_identity_rejected():
    result = parse_discovery(payload(entry(), entry(model="m")))
    assert len(result.workers) == 1 and result.workers[0].model is None
    assert "duplicate worker" in result.rejected[0].reason


@pytest.mark.parametrize("version", [2, 0, "1", 1.0, True, None, [1]])
def test_unknown_protocol_version_parses_nothing(version):
    # Even a nonsense `workers` must not be looked at once the version is wrong.
    body = json.dumps({"protocol_version": version, "namespace": 5, "workers": "garbage"})
    with pytest.raises(ProtocolVersionError) as info:
        parse_discovery(body)
    assert info.value.version == version
    assert "protocol_version" in info.value.reason


def test_missing_protocol_version():
    with pytest.raises(ProtocolVersionError, match="no 'protocol_version'"):
        parse_discovery('{"namespace":"dynamo","workers":[]}')


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"not json", "not valid JSON"),
        (b"\xff\xfe\x00garbage", "not valid JSON"),
        ("[]", "must be a JSON object, got list"),
        ("null", "must be a JSON object, got NoneType"),
        ('{"protocol_version":1,"namespace":null,"workers":[]}', "'namespace' must be a string"),
        ('{"protocol_version":1,"namespace":"d","workers":{}}', "'workers' must be an array"),
        ('{"protocol_version":1,"namespace":"d"}', "'workers' must be an array"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ],
)
def test_malformed_payload(body, reason):
    with pytest.raises(DiscoveryError) as info:
        parse_discovery(body)
    assert reason in info.value.reason
    assert "\n" not in info.value.reason


def test_oversized_payload(monkeypatch):
    monkeypatch.setattr(discovery, "MAX_DISCOVERY_BYTES", 100)
    with pytest.raises(DiscoveryError, match="over the 100-byte limit"):
        parse_discovery(payload(entry()))


def test_default_size_cap_is_real():
    with pytest.raises(DiscoveryError, match="limit"):
        parse_discovery(b" " * (MAX_DISCOVERY_BYTES + 1))


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=30,
)
field_names = st.sampled_from(
    [
        "namespace",
        "component",
        "endpoint",
        "instance_id",
        "transport",
        "request_plane_url",
        "routes",
        "system_url",
        "admin_base_url",
        "model",
        "world_size",
        "error",
    ]
)
mutated_entry = st.builds(
    lambda drops, sets: {
        **{k: v for k, v in entry().items() if k not in drops},
        **sets,
    },
    st.sets(field_names, max_size=3),
    st.dictionaries(field_names, json_values, max_size=3),
)
payloads = st.one_of(
    json_values.map(json.dumps),
    st.fixed_dictionaries(
        {
            "protocol_version": st.one_of(st.just(1), json_values),
            "namespace": st.one_of(st.text(max_size=10), json_values),
            "workers": st.one_of(
                st.lists(st.one_of(mutated_entry, json_values), max_size=5), json_values
            ),
        }
    ).map(json.dumps),
    st.binary(max_size=200),
    st.text(max_size=200),
)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(payloads)
def test_property_only_discovery_error_escapes(body):
    try:
        result = parse_discovery(body)
    except DiscoveryError:
        return
    # When parsing succeeds every entry is accounted for exactly once.
    data = json.loads(body)
    assert len(result.workers) + len(result.rejected) == len(data["workers"])
    for worker in result.workers:
        assert 0 <= worker.identity.instance_id < 2**64
        assert all(isinstance(r, str) and r for r in worker.routes)


# ---- fetch_discovery over real HTTP -------------------------------------------------------


async def test_fetch_ok(server, client, loopback_policy):
    server.json("/v1/rl/workers", json.loads(payload(entry())))
    result = await fetch_discovery(client, loopback_policy, server.base_url + "/", timeout=5)
    assert result.workers[0].identity.instance_id == BIG_ID
    assert server.hits["/v1/rl/workers"] == 1


async def test_fetch_discovery_failed_500(server, client, loopback_policy):
    server.json(
        "/v1/rl/workers", {"error": "discovery_failed", "message": "etcd list failed"}, status=500
    )
    with pytest.raises(DiscoveryError) as info:
        await fetch_discovery(client, loopback_policy, server.base_url, timeout=5)
    assert info.value.reason == "listener discovery failed: etcd list failed"


async def test_fetch_other_status(server, client, loopback_policy):
    # The main HTTP port answers this 404 when someone configured it instead of the RL port.
    server.json(
        "/v1/rl/workers",
        {"message": "Route not found: GET /v1/rl/workers", "type": "Not Found", "code": 404},
        status=404,
    )
    with pytest.raises(DiscoveryError, match="HTTP 404: Route not found"):
        await fetch_discovery(client, loopback_policy, server.base_url, timeout=5)


async def test_fetch_does_not_follow_redirects(server, client, loopback_policy):
    async def redirect(_request):
        raise web.HTTPFound("/elsewhere")

    server.route("/v1/rl/workers", redirect)
    server.json("/elsewhere", json.loads(payload(entry())))
    with pytest.raises(DiscoveryError, match="HTTP 302 redirect to '/elsewhere'"):
        await fetch_discovery(client, loopback_policy, server.base_url, timeout=5)
    assert "/elsewhere" not in server.hits


async def test_fetch_policy_violation_sends_nothing(server, client):
    policy = OutboundPolicy.from_cidrs(["10.0.0.0/8"])
    with pytest.raises(DiscoveryError, match=r"outbound policy: .*outside the allowed networks"):
        await fetch_discovery(client, policy, server.base_url, timeout=5)
    assert server.hits == {}


async def test_fetch_unreachable(client, loopback_policy):
    import socket

    with socket.socket() as s:  # a port that is certainly closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(DiscoveryError, match=r"^listener unreachable: "):
        await fetch_discovery(client, loopback_policy, f"http://127.0.0.1:{port}", timeout=5)


async def test_fetch_dropped_connection(server, client, loopback_policy):
    server.route("/v1/rl/workers", drop_connection)
    with pytest.raises(DiscoveryError, match=r"^listener unreachable: "):
        await fetch_discovery(client, loopback_policy, server.base_url, timeout=5)


async def test_fetch_reply_that_is_not_http(not_http, client, loopback_policy):
    with pytest.raises(DiscoveryError, match=r"^listener reply is not HTTP: Bad status line"):
        await fetch_discovery(client, loopback_policy, not_http, timeout=5)


async def test_fetch_timeout(server, client, loopback_policy):
    server.route("/v1/rl/workers", server.hang)
    with pytest.raises(DiscoveryError, match=r"listener timed out after 0\.2s"):
        await fetch_discovery(client, loopback_policy, server.base_url, timeout=0.2)


async def test_fetch_body_cap_while_streaming(server, client, loopback_policy, monkeypatch):
    monkeypatch.setattr(discovery, "MAX_DISCOVERY_BYTES", 1000)

    async def chunked(request):
        # No content-length: the cap must trigger while streaming, not from the header.
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        await response.prepare(request)
        for _ in range(100):
            await response.write(b" " * 100)
        await response.write_eof()
        return response

    server.route("/v1/rl/workers", chunked)
    with pytest.raises(DiscoveryError, match="exceeds the 1000-byte limit"):
        await fetch_discovery(client, loopback_policy, server.base_url, timeout=5)


async def test_fetch_protocol_error_propagates(server, client, loopback_policy):
    server.json("/v1/rl/workers", {"protocol_version": 2, "namespace": "x", "workers": []})
    with pytest.raises(ProtocolVersionError):
        await fetch_discovery(client, loopback_policy, server.base_url, timeout=5)
