"""call_admin against a real local HTTP server: policy first, verbatim URLs, no raising."""

import json

from aiohttp import web

from controlplane.dynamo.admin import (
    CACHED_REPLY_BYTES,
    PreparedCall,
    ReplyCache,
    admin_url,
    call_admin,
    decode_body,
    judge_reply,
)
from controlplane.dynamo.families import SGLANG, VLLM_SIDECAR, VLLM_WORKER, AdminCall, Operation
from controlplane.dynamo.http import NO_BODY
from controlplane.dynamo.policy import OutboundPolicy

from .conftest import drop_connection


def test_admin_url_keeps_route_verbatim():
    call = AdminCall(Operation.PAUSE, "POST", "engine/control/pause_generation", {})
    assert admin_url("http://h:1/", call) == "http://h:1/engine/control/pause_generation"
    assert admin_url("http://h:1/base", call) == "http://h:1/base/engine/control/pause_generation"


async def test_success_sends_body_and_interprets(server, client, loopback_policy):
    server.json(
        "/engine/pause_generation",
        {"status": "ok", "message": "Engine paused", "mode": "keep", "clear_cache": False},
    )
    (call,) = VLLM_WORKER.build(Operation.PAUSE, mode="keep")
    result = await call_admin(
        client, loopback_policy, server.base_url, VLLM_WORKER, call, timeout=5
    )
    assert result.ok and result.error is None
    assert result.http_status == 200
    assert result.body["message"] == "Engine paused"
    assert json.loads(server.bodies["/engine/pause_generation"][0]) == {"mode": "keep"}
    assert result.url == server.base_url + "/engine/pause_generation"
    assert result.duration_ms >= 0 and result.finished_at >= result.started_at


async def test_text_plain_json_and_error_body_with_200(server, client, loopback_policy):
    async def handler(_request):
        # The system server labels JSON as text/plain; errors can come with HTTP 200.
        return web.Response(
            text=json.dumps({"status": "error", "message": "Missing 'model_path' in body"}),
            content_type="text/plain",
        )

    server.route("/engine/update_weights_from_disk", handler)
    (call,) = VLLM_WORKER.build(Operation.UPDATE_FROM_DISK, model_path="/x")
    result = await call_admin(
        client, loopback_policy, server.base_url, VLLM_WORKER, call, timeout=5
    )
    assert not result.ok
    assert result.http_status == 200
    assert result.error == "Missing 'model_path' in body"


async def test_sidecar_get_version_data(server, client, loopback_policy):
    server.json("/engine/control/get_weight_version", {"weight_version": "v3"})
    (call,) = VLLM_SIDECAR.build(Operation.GET_WEIGHT_VERSION)
    result = await call_admin(
        client, loopback_policy, server.base_url, VLLM_SIDECAR, call, timeout=5
    )
    assert result.ok
    assert result.data["version"] == "v3" and result.data["version_declared"] is True


async def test_sidecar_liveness_uses_get_health(server, client, loopback_policy):
    methods = []

    async def health(request):
        methods.append(request.method)
        return web.json_response({"status": "ready"})

    server.route("/health", health)
    (call,) = VLLM_SIDECAR.build(Operation.LIVENESS)
    result = await call_admin(
        client, loopback_policy, server.base_url, VLLM_SIDECAR, call, timeout=5
    )
    assert result.ok and methods == ["GET"]


async def test_http_500_handler_error(server, client, loopback_policy):
    server.json(
        "/engine/control/update_weights_from_disk",
        {"error": "Handler error", "message": "Python callback failed: TypeError: bad field"},
        status=500,
    )
    (call,) = SGLANG.build(Operation.UPDATE_FROM_DISK, model_path="/m")
    result = await call_admin(client, loopback_policy, server.base_url, SGLANG, call, timeout=5)
    assert not result.ok
    assert result.http_status == 500
    assert result.error == "HTTP 500: Handler error: Python callback failed: TypeError: bad field"


async def test_missing_route_404(server, client, loopback_policy):
    (call,) = VLLM_WORKER.build(Operation.FLUSH_CACHE)
    result = await call_admin(
        client, loopback_policy, server.base_url, VLLM_WORKER, call, timeout=5
    )
    assert not result.ok and result.http_status == 404
    assert "Route /engine/flush_cache not found" in result.error


async def test_policy_violation_sends_no_request(server, client):
    policy = OutboundPolicy.from_cidrs(["10.0.0.0/8"])
    (call,) = VLLM_WORKER.build(Operation.PAUSE)
    server.json("/engine/pause_generation", {"status": "ok"})
    result = await call_admin(client, policy, server.base_url, VLLM_WORKER, call, timeout=5)
    assert not result.ok and result.http_status is None
    assert result.error.startswith("outbound policy: ")
    assert server.hits == {}


async def test_metadata_system_url_refused(client, loopback_policy):
    (call,) = VLLM_WORKER.build(Operation.PAUSE)
    result = await call_admin(
        client, loopback_policy, "http://169.254.169.254", VLLM_WORKER, call, timeout=5
    )
    assert not result.ok and "169.254.169.254" in result.error


async def test_redirect_not_followed(server, client, loopback_policy):
    async def redirect(_request):
        raise web.HTTPTemporaryRedirect("/engine/elsewhere")

    server.route("/engine/pause_generation", redirect)
    server.json("/engine/elsewhere", {"status": "ok"})
    (call,) = VLLM_WORKER.build(Operation.PAUSE)
    result = await call_admin(
        client, loopback_policy, server.base_url, VLLM_WORKER, call, timeout=5
    )
    assert not result.ok and result.http_status == 307
    assert "redirect" in result.error
    assert "/engine/elsewhere" not in server.hits


async def test_timeout_is_a_result(server, client, loopback_policy):
    server.route("/engine/init_weights_update_group", server.hang)
    (call,) = VLLM_WORKER.build(Operation.INIT_WEIGHTS_GROUP)
    result = await call_admin(
        client, loopback_policy, server.base_url, VLLM_WORKER, call, timeout=0.2
    )
    assert not result.ok and result.http_status is None
    assert result.error == "timed out after 0.2s"
    assert result.duration_ms >= 200


async def test_dropped_connection_is_a_result(server, client, loopback_policy):
    server.route("/engine/update_weights_from_disk", drop_connection)
    (call,) = VLLM_WORKER.build(Operation.UPDATE_FROM_DISK, model_path="/m")
    result = await call_admin(
        client, loopback_policy, server.base_url, VLLM_WORKER, call, timeout=5
    )
    assert not result.ok and result.http_status is None
    assert result.error.startswith("connection dropped")


async def test_a_reply_that_is_not_http_is_a_result(not_http, client, loopback_policy):
    """A peer that answers garbage (not an HTTP status line) is journaled as a failed call;
    the executor never sees the HTTP library's own exception."""
    (call,) = VLLM_WORKER.build(Operation.GET_WEIGHT_VERSION)
    result = await call_admin(client, loopback_policy, not_http, VLLM_WORKER, call, timeout=5)
    assert not result.ok and result.http_status is None
    assert result.error.startswith("request failed: "), result.error
    assert "\n" not in result.error


async def test_connection_refused_is_a_result(client, loopback_policy):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (call,) = VLLM_WORKER.build(Operation.RESUME)
    result = await call_admin(
        client, loopback_policy, f"http://127.0.0.1:{port}", VLLM_WORKER, call, timeout=5
    )
    assert not result.ok and result.error.startswith("connection failed")


def test_reply_cache_decodes_each_distinct_small_body_once():
    replies = ReplyCache()
    first = replies.decode(b'{"status":"ok"}')
    assert first == {"status": "ok"}
    assert replies.decode(b'{"status":"ok"}') is first
    assert replies.decode(b'{"status":"error"}') == {"status": "error"}
    big = b'{"pad":"' + b"x" * CACHED_REPLY_BYTES + b'"}'
    assert replies.decode(big) is not replies.decode(big)  # large bodies are not kept
    assert replies.decode(b"not json") == "not json"


def test_reply_cache_judges_each_distinct_reply_once_as_the_family_would():
    replies = ReplyCache()
    (pause,) = VLLM_WORKER.build(Operation.PAUSE)
    (version,) = VLLM_WORKER.build(Operation.GET_WEIGHT_VERSION)
    ok_body = b'{"status":"ok"}'
    first = replies.judge(VLLM_WORKER, pause, 200, ok_body)
    assert first == (True, {"status": "ok"}, None, {"status": "ok"})
    assert replies.judge(VLLM_WORKER, pause, 200, ok_body) is first
    # The operation, the status and the family are part of what is judged.
    assert replies.judge(VLLM_WORKER, version, 200, ok_body)[:3] == (
        False,
        {"status": "ok"},
        "get_weight_version reply lacks 'version'/'version_declared'",
    )
    assert replies.judge(VLLM_WORKER, pause, 500, ok_body)[0] is False
    assert replies.judge(SGLANG, pause, 200, ok_body) == judge_reply(
        SGLANG, pause, 200, {"status": "ok"}
    )
    # Errors come back in one line, as call_admin reports them.
    multiline = b'{"status":"error","message":"bad\\n  news"}'
    assert replies.judge(VLLM_WORKER, pause, 200, multiline)[2] == "bad news"
    big = b'{"status":"ok","pad":"' + b"x" * CACHED_REPLY_BYTES + b'"}'
    judged = replies.judge(VLLM_WORKER, pause, 200, big)
    assert judged[0] and judged == judge_reply(VLLM_WORKER, pause, 200, decode_body(big))
    assert replies.judge(VLLM_WORKER, pause, 200, big) is not judged  # large bodies not kept


def test_prepared_call_encodes_its_body_once_as_call_admin_sent_it():
    post = PreparedCall.of(AdminCall(Operation.PAUSE, "POST", "engine/pause_generation", None))
    assert post.wire == b"{}" and post.body_json is None
    body = {"path": "/ckpt/é", "n": 1}
    update = PreparedCall.of(AdminCall(Operation.UPDATE_FROM_DISK, "POST", "engine/u", body))
    assert update.wire == '{"path":"/ckpt/é","n":1}'.encode()
    assert update.body_json == '{"path":"/ckpt/é","n":1}'
    get = PreparedCall.of(AdminCall(Operation.GET_WEIGHT_VERSION, "GET", "engine/v", None))
    assert get.wire is NO_BODY
