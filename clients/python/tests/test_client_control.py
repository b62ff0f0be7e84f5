"""`ControlPlane` against a scripted server (httpx.MockTransport): signed sends and their
retries, typed errors with the server's codes, ETag reuse, waiting for the gate, admitted
instances, and the ledger-or-gate choice."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Callable

import httpx
import pytest
from dynamo_rl_trainer import (
    CheckpointRefused,
    Conflict,
    ControlPlane,
    GateTimeout,
    GateView,
    LedgerView,
    NotFound,
    WebhookRefused,
)

SECRET = "whsec_" + base64.b64encode(b"s" * 32).decode()
NEXT = "whsec_" + base64.b64encode(b"t" * 32).decode()


def gate_body(state="open", version="step-1", instances=("18446744073709551611",), revision=1):
    return {
        "source": "sim",
        "namespace": "rl-a",
        "state": state,
        "open": state.startswith("open"),
        "since": "2026-01-01T00:00:00+00:00",
        "reason": "",
        "verified_version": version,
        "verified_instances": list(instances),
        "verified_count": len(instances),
        "unverified_count": 0,
        "confirmed_at": None,
        "drift": [],
        "drift_count": 0,
        "instance_sets": {},
        "left_out": [],
        "left_out_count": 0,
        "active_refresh_id": None,
        "revision": revision,
        "updated_at": None,
    }


def client(handler: Callable[[httpx.Request], httpx.Response], **kwargs) -> ControlPlane:
    options = {"endpoint": "trainer-a", "secrets": [SECRET], "token": "cpt_x"} | kwargs
    return ControlPlane(
        "http://cp.test",
        source="sim",
        namespace="rl-a",
        transport=httpx.MockTransport(handler),
        **options,
    )


def error(status: int, code: str, message: str = "refused") -> httpx.Response:
    return httpx.Response(
        status, json={"error": {"code": code, "message": message, "details": None}}
    )


def verifies(request: httpx.Request, secret: str) -> bool:
    key = base64.b64decode(secret.removeprefix("whsec_"))
    content = (
        f"{request.headers['webhook-id']}.{request.headers['webhook-timestamp']}.".encode()
        + request.content
    )
    expected = base64.b64encode(hmac.new(key, content, hashlib.sha256).digest()).decode()
    return f"v1,{expected}" in request.headers["webhook-signature"].split()


def test_announce_checkpoint_sends_a_signed_checkpoint_ready_event():
    seen = []

    def handler(request):
        seen.append(request)
        return httpx.Response(
            202,
            json={
                "status": "accepted",
                "webhook_id": request.headers["webhook-id"],
                "outcome": "accepted",
                "state": "queued",
                "delivery_id": 7,
                "queued": True,
            },
        )

    answer = client(handler).announce_checkpoint("step-1", model_path="/ckpt/1", step=1)
    (request,) = seen
    assert request.url.path == "/api/v1/webhooks/trainer/trainer-a"
    assert json.loads(request.content) == {
        "type": "checkpoint.ready",
        "data": {"weight_version": "step-1", "model_path": "/ckpt/1", "step": 1},
    }
    assert verifies(request, SECRET)
    assert "authorization" in request.headers  # harmless: the webhook view ignores it
    assert (answer.http_status, answer.status, answer.delivery_id) == (202, "accepted", 7)
    assert answer.webhook_id == request.headers["webhook-id"]


def test_while_rotating_both_secrets_sign_every_delivery():
    seen = []

    def handler(request):
        seen.append(request)
        return httpx.Response(200, json={"status": "ok", "webhook_id": "x", "outcome": "test"})

    client(handler, secrets=[SECRET, NEXT]).send_event("test.ping", {})
    assert verifies(seen[0], SECRET) and verifies(seen[0], NEXT)


def test_a_dropped_or_failed_send_is_retried_with_the_same_webhook_id():
    seen = []

    def handler(request):
        seen.append(request.headers["webhook-id"])
        if len(seen) == 1:
            raise httpx.ConnectError("refused")
        if len(seen) == 2:
            return httpx.Response(503, text="unavailable")
        return httpx.Response(
            202, json={"status": "accepted", "webhook_id": seen[-1], "outcome": "accepted"}
        )

    answer = client(handler).announce_checkpoint("step-1", model_path="/ckpt/1")
    assert len(seen) == 3 and len(set(seen)) == 1
    assert answer.webhook_id == seen[0]


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (401, "bad_signature"),
        (404, "unknown_endpoint"),
        (422, "invalid_event"),
        (409, "webhook_id_reused"),
    ],
)
def test_a_refused_webhook_raises_with_the_servers_code(status, code):
    with pytest.raises(WebhookRefused) as refused:
        client(lambda r: error(status, code)).announce_checkpoint("v", model_path="/p")
    assert (refused.value.status, refused.value.code) == (status, code)


def test_announce_needs_exactly_one_update_method():
    with pytest.raises(ValueError):
        client(lambda r: httpx.Response(500)).announce_checkpoint("v")


def test_reports_are_signed_events_for_the_refresh():
    bodies = []

    def handler(request):
        bodies.append(json.loads(request.content))
        return httpx.Response(
            200, json={"status": "ok", "webhook_id": "x", "outcome": "broadcast_done"}
        )

    cp = client(handler)
    cp.report_broadcast_done(42, weight_version="step-2", attempt=2)
    cp.canary_verdict(
        42, weight_version="step-2", passed=False, metrics={"reward": 0.1}, reason="regressed"
    )
    assert bodies == [
        {
            "type": "broadcast.done",
            "data": {"refresh_id": 42, "weight_version": "step-2", "attempt": 2},
        },
        {
            "type": "canary.verdict",
            "data": {
                "refresh_id": 42,
                "weight_version": "step-2",
                "passed": False,
                "metrics": {"reward": 0.1},
                "reason": "regressed",
            },
        },
    ]


def test_a_report_nothing_waits_for_is_a_conflict_with_its_code():
    with pytest.raises(Conflict) as conflict:
        client(lambda r: error(409, "conflict", "no canary waits")).canary_verdict(
            1, weight_version="v", passed=True
        )
    assert conflict.value.code == "conflict"


def test_the_gate_reuses_its_etag_and_a_304_keeps_the_last_answer():
    sent_tags = []

    def handler(request):
        assert request.headers["authorization"] == "Bearer cpt_x"
        sent_tags.append(request.headers.get("if-none-match"))
        if request.headers.get("if-none-match") == '"1.a.1"':
            return httpx.Response(304, headers={"ETag": '"1.a.1"'})
        return httpx.Response(200, json=gate_body(), headers={"ETag": '"1.a.1"'})

    cp = client(handler)
    first = cp.gate()
    second = cp.gate()
    assert sent_tags == [None, '"1.a.1"']
    assert second is first
    assert first.verified_instances == (18446744073709551611,)  # exact u64, from the string


def test_wait_for_gate_polls_until_it_is_verified_open_at_the_version():
    answers = iter(
        [
            gate_body(state="closed", version="step-0", revision=1),
            gate_body(state="open", version="step-0", revision=2),
            gate_body(state="open_forced", version="step-1", revision=3),
            gate_body(state="open", version="step-1", revision=4),
        ]
    )

    def handler(request):
        body = next(answers)
        return httpx.Response(200, json=body, headers={"ETag": f'"{body["revision"]}"'})

    gate = client(handler).wait_for_gate("step-1", timeout=30, poll_interval=0)
    assert (gate.state, gate.revision) == ("open", 4)


def test_wait_for_gate_raises_with_the_last_gate_when_time_runs_out():
    cp = client(lambda r: httpx.Response(200, json=gate_body(state="closed", version="step-0")))
    with pytest.raises(GateTimeout) as timeout:
        cp.wait_for_gate("step-1", timeout=0)
    assert timeout.value.last.state == "closed"


def test_wait_for_gate_stops_at_once_when_the_checkpoint_was_refused():
    def handler(request):
        if "/deliveries/" in request.url.path:
            return httpx.Response(
                200,
                json={
                    "webhook_id": "msg_1",
                    "state": "done",
                    "terminal": True,
                    "outcome": "plan_blocked",
                    "refresh_id": None,
                    "refresh_state": None,
                    "attempts": 1,
                    "last_error": "",
                    "detail": "worker w1 lacks update_weights_from_disk",
                },
            )
        return httpx.Response(200, json=gate_body(state="open", version="step-0"))

    from dynamo_rl_trainer import WebhookAnswer

    answer = WebhookAnswer(202, "accepted", "msg_1", "accepted")
    with pytest.raises(CheckpointRefused) as refused:
        client(handler).wait_for_gate("step-1", timeout=300, checkpoint=answer)
    assert "lacks update_weights_from_disk" in str(refused.value)


def test_an_unknown_gate_raises_not_found_with_the_code():
    with pytest.raises(NotFound) as missing:
        client(lambda r: error(404, "not_found", "no namespace")).gate()
    assert missing.value.code == "not_found"


def workers_page(request):
    offset = int(request.url.params["offset"])
    items = [
        {"instance_id": "18446744073709551611", "model": "policy", "weight_version": "step-1"},
        {"instance_id": "7", "model": "policy", "weight_version": "step-0"},
    ][offset : offset + 1]
    return httpx.Response(200, json={"items": items, "count": 2, "limit": 1, "offset": offset})


def test_admitted_instances_are_the_gates_verified_set_with_their_models():
    def handler(request):
        if request.url.path.endswith("/workers"):
            assert request.url.params["state"] == "live"
            return workers_page(request)
        return httpx.Response(200, json=gate_body())

    admitted = client(handler).admitted_instances()
    assert admitted.version == "step-1"
    assert admitted.instance_ids == (18446744073709551611,)
    assert admitted.instances[0].model == "policy"


def test_a_closed_gate_admits_no_instance():
    admitted = client(
        lambda r: httpx.Response(200, json=gate_body(state="closed"))
    ).admitted_instances()
    assert admitted.instance_ids == ()


def test_without_the_provenance_route_the_guard_reads_the_gate():
    def handler(request):
        if request.url.path.endswith("openapi.json"):
            return httpx.Response(200, json={"paths": {"/api/v1/gates/{source}/{namespace}": {}}})
        if request.url.path.endswith("/workers"):
            return workers_page(request)
        return httpx.Response(200, json=gate_body())

    assert isinstance(client(handler).admission_view(), GateView)


def served(version: str) -> dict:
    """The provenance API's answer for one admitted, verified interval (server shape)."""
    interval = {"versions": [version], "version": version, "confidence": "verified"}
    interval |= {"admitted": True, "admission": "verified", "serving": "serving"}
    return {"instance_id": "1", "versions": [version], "intervals": [interval]}


def test_with_the_provenance_route_the_guard_asks_the_serving_ledger():
    asked = []

    def handler(request):
        path = request.url.path
        if path.endswith("openapi.json"):
            return httpx.Response(200, json={"paths": {"/api/v1/provenance": {}}})
        if path.endswith("/workers"):
            return workers_page(request)
        if path == "/api/v1/provenance":
            asked.append(dict(request.url.params))
            if request.url.params["instance_id"] == "7":
                return httpx.Response(200, json=served("step-0"))
            if request.url.params["instance_id"] == "9":
                return error(404, "not_found", "no such instance")
            return httpx.Response(200, json=served("step-1"))
        raise AssertionError(path)

    view = client(handler).admission_view()
    assert isinstance(view, LedgerView)
    assert view.admission(18446744073709551611, "step-1", at=1767225600.0).admitted
    stale = view.admission(7, "step-1", at=1767225600.0)
    assert not stale.admitted and "served ['step-0']" in stale.reason
    assert not view.admission(9, "step-1", at=1767225600.0).admitted
    assert asked[0] == {"instance_id": "18446744073709551611", "at": "2026-01-01T00:00:00+00:00"}
    assert view.identity(7).model == "policy"


def test_a_gate_that_does_not_exist_yet_is_waited_for_and_named_on_timeout():
    answers = iter([error(404, "not_found", "source 'sim' has no namespace 'rl-a'")])

    def handler(request):
        return next(answers, None) or httpx.Response(200, json=gate_body(version="step-1"))

    assert client(handler).wait_for_gate("step-1", timeout=30, poll_interval=0).revision == 1
    missing = client(lambda r: error(404, "not_found", "source 'sim' has no namespace 'rl-x'"))
    with pytest.raises(GateTimeout) as timeout:
        missing.wait_for_gate("step-1", timeout=0)
    assert "has no namespace 'rl-x'" in str(timeout.value)


def group_body(state, refresh_state="updating", attempt=1):
    return {
        "refresh_id": 42,
        "refresh_state": refresh_state,
        "state": state,
        "attempt": attempt,
        "world_size": 3,
        "weight_version": "step-2",
        "reason": "",
    }


def test_waiting_for_the_group_long_polls_after_the_state_it_saw():
    asked = []
    answers = iter([group_body("joining"), group_body("ready", attempt=2)])

    def handler(request):
        asked.append(dict(request.url.params))
        return httpx.Response(200, json=next(answers))

    group = client(handler).wait_for_group_ready(42, timeout=120)
    assert (group.state, group.attempt) == ("ready", 2)
    assert asked == [{}, {"wait": "30", "after": "joining"}]


def test_a_group_whose_refresh_ended_is_not_waited_for():
    cp = client(lambda r: httpx.Response(200, json=group_body("torn_down", refresh_state="held")))
    with pytest.raises(Conflict) as conflict:
        cp.wait_for_group_ready(42, timeout=120)
    assert conflict.value.code == "group_not_ready"
