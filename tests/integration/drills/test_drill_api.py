"""Rollback drills over the JSON API: start (idempotent, audited as the token), read, list
newest first; refusals answer with the status the command's exit code stands for and the
command's own message; a limited token sees only its sources' drills."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from controlplane.accounts.tokens import create_token
from controlplane.audit.models import AuditEvent
from controlplane.audit.recorder import Actor
from controlplane.refresh import intents
from controlplane.refresh.models import DrillOutcome, DrillRun, PolicyRefresh
from tests.integration.drills.helpers import actor_for, run_drill_inline, verified_twice
from tests.integration.refresh.cli import cli_json
from tests.integration.refresh.helpers import fleet_config, make_source, plan

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet(simfleet_factory):
    return simfleet_factory(fleet_config(6))


@pytest.fixture
def source(fleet, operator):
    return verified_twice(fleet, operator)


@pytest.fixture(autouse=True)
def _no_runner(monkeypatch):
    """The drill is advanced inline by the tests that need it to end."""
    monkeypatch.setattr("controlplane.refresh.drills.runner.enqueue_drill", lambda *a, **k: None)


def token_client(user, label="run-7", sources=()) -> Client:
    _, secret = create_token(user=user, label=label, actor=Actor.system(), sources=sources)
    return Client(HTTP_AUTHORIZATION=f"Bearer {secret}")


def post(client, path, body=None, **headers):
    """POST `body` as JSON; without one, an empty body (the default drill)."""
    data = json.dumps(body) if body is not None else ""
    return client.post(path, data, content_type="application/json", **headers)


def test_start_read_and_list(source, operator):
    client = token_client(operator)
    url = f"/api/v1/sources/{source.name}/drills"
    started = post(client, url, {"namespaces": ["rl-b"]}, HTTP_IDEMPOTENCY_KEY="drill-1")
    assert started.status_code == 201, started.content
    body = started.json()
    assert body["source"] == source.name and body["namespaces"] == ["rl-b"]
    assert len(body["instances"]) == 1
    assert body["from_version"] == "v2" and body["to_version"] == "v1"
    assert body["outcome"] == "running" and body["phase"] == "forward"
    assert body["requested_by"] == f"token:run-7 ({operator.username})"

    replayed = post(client, url, {"namespaces": ["rl-b"]}, HTTP_IDEMPOTENCY_KEY="drill-1")
    assert replayed.status_code == 201 and replayed["Idempotent-Replayed"] == "true"
    assert replayed.json() == body
    assert DrillRun.objects.count() == 1
    audit = AuditEvent.objects.get(action="drill.started")
    assert audit.actor_label == f"token:run-7 ({operator.username})"
    assert audit.details["drill_id"] == body["id"] and audit.details["namespaces"] == ["rl-b"]

    drill = run_drill_inline(DrillRun.objects.get(pk=body["id"]))
    assert drill.outcome == DrillOutcome.SUCCEEDED, drill.reason
    done = client.get(f"/api/v1/drills/{drill.pk}").json()
    assert done["outcome"] == "succeeded" and done["phase"] == "done"
    assert done["forward_refresh_id"] == drill.forward_refresh_id is not None
    assert done["back_refresh_id"] == drill.back_refresh_id is not None
    assert done["forward_seconds"] == drill.forward_seconds > 0
    assert done["back_seconds"] == drill.back_seconds > 0
    assert done["finished_at"] is not None and done["reason"] == ""
    forward = PolicyRefresh.objects.get(pk=done["forward_refresh_id"])
    assert forward.instances == done["instances"]

    second = post(client, url, {"count": 1, "namespaces": ["rl-a"]})
    assert second.status_code == 201, second.content
    page = client.get(url).json()
    assert [d["id"] for d in page["items"]] == [second.json()["id"], drill.pk]
    assert page["count"] == 2
    first_page = client.get(f"{url}?limit=1").json()
    assert [d["id"] for d in first_page["items"]] == [second.json()["id"]]
    assert first_page["count"] == 2
    later = client.get(f"{url}?limit=1&offset=1").json()
    assert [d["id"] for d in later["items"]] == [drill.pk]
    succeeded = client.get(f"{url}?outcome=succeeded").json()
    assert [d["id"] for d in succeeded["items"]] == [drill.pk]


def refused(response, status, code):
    assert response.status_code == status, response.content
    error = response.json()["error"]
    assert error["code"] == code, error
    return error


def cli_message(source, user, *args) -> str:
    _, doc = cli_json("drill", source.name, *args, "--as", user.username)
    return doc["error"]["message"]


def test_refusals_answer_with_the_commands_words(source, operator, viewer, approver):
    client = token_client(operator)
    url = f"/api/v1/sources/{source.name}/drills"
    bad = [
        ({"count": 0}, ("--count", "0")),
        ({"instances": ["12345"]}, ("--instance", "12345")),
        ({"namespaces": ["nope"]}, ("--namespace", "nope")),
        ({"count": 5, "namespaces": ["rl-a"]}, ("--count", "5", "--namespace", "rl-a")),
    ]
    for body, args in bad:
        error = refused(post(client, url, body), 422, "validation_error")
        assert error["message"] == cli_message(source, operator, *args), body
    error = refused(post(client, url, {"count": 1, "instances": ["1"]}), 422, "validation_error")
    assert "not both" in error["message"]
    refused(client.post(url, "{", content_type="application/json"), 400, "invalid_json")

    error = refused(post(token_client(viewer, "viewer-token"), url), 403, "forbidden")
    assert error["message"] == cli_message(source, viewer)
    refused(post(client, "/api/v1/sources/nope/drills"), 404, "not_found")

    source.require_approval = True
    source.save(update_fields=["require_approval"])
    waiting = plan(source, operator, "v3")
    intents.start_policy_refresh(waiting, actor=actor_for(operator), enqueue=False)
    error = refused(post(client, url), 409, "refresh_conflict")
    assert error["message"] == cli_message(source, operator)
    assert f"#{waiting.pk}" in error["message"]
    assert error["details"] == {"active_refresh_id": waiting.pk}
    assert not DrillRun.objects.exists()
    assert not AuditEvent.objects.filter(action="drill.started").exists()

    intents.reject_policy_refresh(waiting, actor=actor_for(approver), reason="not now")
    assert post(client, url).status_code == 201
    error = refused(post(client, url), 409, "refresh_conflict")
    assert "is still running" in error["message"]


def test_nothing_to_roll_back_to_is_a_conflict(fleet, operator):
    from tests.integration.refresh.helpers import run_inline

    source = make_source(fleet)
    run_inline(source, operator, "v1")
    error = refused(
        post(token_client(operator), f"/api/v1/sources/{source.name}/drills"),
        409,
        "invalid_transition",
    )
    assert "nothing to roll back to" in error["message"]


def test_a_limited_token_sees_only_its_sources_drills(fleet, source, operator):
    other = make_source(fleet, name="other")
    drill = post(token_client(operator), f"/api/v1/sources/{source.name}/drills").json()
    elsewhere = token_client(operator, "elsewhere", sources=[other])
    refused(elsewhere.get(f"/api/v1/drills/{drill['id']}"), 404, "not_found")
    refused(elsewhere.get(f"/api/v1/sources/{source.name}/drills"), 404, "not_found")
    refused(post(elsewhere, f"/api/v1/sources/{source.name}/drills"), 404, "not_found")
    assert elsewhere.get(f"/api/v1/sources/{other.name}/drills").json()["count"] == 0

    here = token_client(operator, "here", sources=[source])
    assert here.get(f"/api/v1/drills/{drill['id']}").json()["id"] == drill["id"]
    assert here.get(f"/api/v1/sources/{source.name}/drills").json()["count"] == 1
