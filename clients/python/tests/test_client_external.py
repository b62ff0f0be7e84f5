"""The `external` update method from the trainer's side: announcing an external checkpoint,
waiting until the refresh paused its workers for the trainer, and reporting `applied` (typed
result, typed errors with the server's codes)."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable

import httpx
import pytest
from dynamo_rl_trainer import (
    ApplyRequest,
    ApplyTimeout,
    Conflict,
    ControlPlane,
    NotFound,
    WebhookRefused,
)

SECRET = "whsec_" + base64.b64encode(b"s" * 32).decode()
BIG = "18446744073709551611"


def client(handler: Callable[[httpx.Request], httpx.Response]) -> ControlPlane:
    return ControlPlane(
        "http://cp.test",
        source="sim",
        namespace="rl-a",
        endpoint="trainer-a",
        secrets=[SECRET],
        token="cpt_x",
        transport=httpx.MockTransport(handler),
    )


def error(status: int, code: str, message: str = "refused") -> httpx.Response:
    return httpx.Response(
        status, json={"error": {"code": code, "message": message, "details": None}}
    )


def view(refresh_state="awaiting_apply", state="awaiting", applied=(), missing=(BIG, "7")):
    return {
        "refresh_id": 42,
        "refresh_state": refresh_state,
        "weight_version": "step-2",
        "state": state,
        "attempt": 1,
        "requested_at": "2026-01-01T00:00:00+00:00",
        "deadline": "2026-01-01T00:10:00+00:00",
        "workers": [
            {
                "instance_id": BIG,
                "namespace": "rl-a",
                "key": f"rl-a/backend/generate/{BIG}",
                "family": "vllm",
                "system_url": "http://10.0.0.5:9090",
            },
            {
                "instance_id": "7",
                "namespace": "rl-a",
                "key": "rl-a/backend/generate/7",
                "family": "sglang",
                "system_url": "http://10.0.0.6:9090",
            },
        ],
        "applied": list(applied),
        "missing": list(missing),
        "reason": "",
    }


def test_an_external_checkpoint_is_announced_with_its_timeout():
    bodies = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(
            202, json={"status": "accepted", "webhook_id": "x", "outcome": "accepted"}
        )

    cp = client(handler)
    cp.announce_checkpoint("step-2", external={"apply_timeout_s": 90}, step=2)
    cp.announce_checkpoint("step-3", external=True)
    assert bodies[0]["data"] == {
        "weight_version": "step-2",
        "external": {"apply_timeout_s": 90},
        "step": 2,
    }
    assert bodies[1]["data"] == {"weight_version": "step-3", "external": {}}
    with pytest.raises(ValueError, match="exactly one of"):
        cp.announce_checkpoint("v", model_path="/m", external=True)


def test_report_applied_sends_the_signed_event_and_answers_the_apply_view():
    bodies = []

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/api/v1/webhooks/trainer/trainer-a"
        assert request.headers["webhook-signature"].startswith("v1,")
        bodies.append(json.loads(request.content))
        return httpx.Response(
            200,
            json={
                "status": "ok",
                "webhook_id": "x",
                "outcome": "applied",
                "refresh_id": 42,
                "external": view(applied=[BIG], missing=["7"]),
            },
        )

    cp = client(handler)
    answer = cp.report_applied(42, "step-2", [int(BIG)])
    assert bodies == [
        {
            "type": "refresh.applied",
            "data": {"refresh_id": 42, "weight_version": "step-2", "instance_ids": [BIG]},
        }
    ]
    assert isinstance(answer, ApplyRequest)
    assert answer.applied == (BIG,) and answer.missing == ("7",) and answer.awaiting
    assert answer.workers[0].instance_id == int(BIG)
    assert answer.workers[1].system_url == "http://10.0.0.6:9090"
    cp.report_applied(42, "step-2")
    assert bodies[1]["data"] == {"refresh_id": 42, "weight_version": "step-2"}


@pytest.mark.parametrize(
    ("status", "code", "kind"),
    [
        (409, "weight_version_mismatch", Conflict),
        (409, "instance_not_in_refresh", Conflict),
        (409, "not_awaiting_apply", Conflict),
        (404, "unknown_refresh", NotFound),
    ],
)
def test_a_refused_report_raises_with_the_servers_code(status, code, kind):
    with pytest.raises(kind) as refused:
        client(lambda r: error(status, code)).report_applied(42, "step-9")
    assert refused.value.code == code and refused.value.status == status
    assert isinstance(refused.value, WebhookRefused)


def test_waiting_for_ready_for_apply_polls_the_refresh_until_its_workers_wait():
    answers = iter([view("gating", ""), view("pausing", ""), view()])
    paths = []

    def handler(request: httpx.Request) -> httpx.Response:
        paths.append(request.url.path)
        assert request.headers["authorization"] == "Bearer cpt_x"
        return httpx.Response(200, json=next(answers))

    ready = client(handler).wait_for_ready_for_apply(42, timeout=5, poll_interval=0.01)
    assert ready.awaiting and ready.attempt == 1 and ready.weight_version == "step-2"
    assert paths == ["/api/v1/refreshes/42/external"] * 3


def test_a_refresh_that_held_before_asking_is_a_conflict_and_time_runs_out_typed():
    held = view("held", "", missing=())
    with pytest.raises(Conflict) as conflict:
        client(lambda r: httpx.Response(200, json=held)).wait_for_ready_for_apply(42, timeout=5)
    assert conflict.value.code == "refresh_held"
    pausing = view("pausing", "")
    with pytest.raises(ApplyTimeout) as timeout:
        client(lambda r: httpx.Response(200, json=pausing)).wait_for_ready_for_apply(
            42, timeout=0.05, poll_interval=0.01
        )
    assert timeout.value.last.refresh_state == "pausing"
