"""Tokens (create, secret once, revoke, expiry, attribution) and the gate API's caching."""

import io
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from controlplane.accounts.models import ApiToken
from controlplane.audit.models import AuditEvent
from controlplane.audit.recorder import Actor
from controlplane.refresh import gates
from controlplane.refresh.models import GateState
from tests.api.conftest import U64, bearer


def test_token_command_prints_the_secret_once_and_stores_only_its_hash(fleet, operator):
    out = io.StringIO()
    call_command(
        "token",
        "create",
        "--user",
        operator.username,
        "--label",
        "ci",
        "--source",
        "src-a",
        "--expires-days",
        "30",
        stdout=out,
        stderr=io.StringIO(),
    )
    secret = out.getvalue().strip()
    token = ApiToken.objects.get(label="ci")
    assert secret.startswith("cpt_") and secret not in token.secret_hash
    assert list(token.sources.values_list("name", flat=True)) == ["src-a"]
    assert AuditEvent.objects.filter(action="token.created", target_id=str(token.pk)).exists()
    response = Client().get("/api/v1/sources", **bearer(secret))
    assert response.status_code == 200
    assert [s["name"] for s in response.json()["items"]] == ["src-a"]

    call_command("token", "revoke", "ci", stdout=io.StringIO())
    assert Client().get("/api/v1/sources", **bearer(secret)).status_code == 401
    assert AuditEvent.objects.filter(action="token.revoked").exists()


def test_expired_and_forged_tokens_are_refused(fleet, admin_user, token_factory):
    secret = token_factory(admin_user, label="old")
    ApiToken.objects.filter(label="old").update(expires_at=timezone.now() - timedelta(seconds=1))
    assert Client().get("/api/v1/sources", **bearer(secret)).status_code == 401
    forged = secret[:-4] + "AAAA"
    assert Client().get("/api/v1/sources", **bearer(forged)).status_code == 401
    assert Client().get("/api/v1/sources", HTTP_AUTHORIZATION="Basic x").status_code == 401


def test_last_use_is_recorded_at_most_once_a_minute(fleet, admin_user, token_factory):
    secret = token_factory(admin_user, label="poller")
    client = Client()
    client.get("/api/v1/sources", **bearer(secret))
    first = ApiToken.objects.get(label="poller").last_used_at
    client.get("/api/v1/sources", **bearer(secret))
    assert ApiToken.objects.get(label="poller").last_used_at == first is not None


def test_changes_made_with_a_token_are_attributed_to_it(fleet, operator, token_factory):
    secret = token_factory(operator, label="trainer-bot")
    response = Client().post("/api/v1/sources/src-a/refresh", **bearer(secret))
    assert response.status_code == 202
    requested = AuditEvent.objects.get(action="discovery.requested")
    assert requested.actor_type == "token"
    assert requested.actor_label.startswith("token:trainer-bot")
    assert AuditEvent.objects.filter(action="api.request", actor_type="token").exists()


def test_instance_id_round_trips_as_a_string(fleet, viewer_client):
    items = viewer_client.get("/api/v1/workers?namespace=rl-a").json()["items"]
    assert items[0]["instance_id"] == U64


def test_gate_etag_gives_304_until_the_gate_changes(
    fleet, viewer_client, django_capture_on_commit_callbacks
):
    first = viewer_client.get("/api/v1/gates/src-a/rl-a")
    assert first.status_code == 200
    body = first.json()
    assert body["open"] is False and body["reason"] == "held"
    assert "no-cache" in first["Cache-Control"]
    etag = first["ETag"]
    again = viewer_client.get("/api/v1/gates/src-a/rl-a", HTTP_IF_NONE_MATCH=etag)
    assert again.status_code == 304 and again.content == b""
    with django_capture_on_commit_callbacks(execute=True):
        gates.force_open([fleet["gate"]], actor=Actor.system(), refresh=None, reason="ops said")
    changed = viewer_client.get("/api/v1/gates/src-a/rl-a", HTTP_IF_NONE_MATCH=etag)
    assert changed.status_code == 200 and changed.json()["open"] is True
    assert changed.json()["state"] == GateState.OPEN_FORCED


def test_gate_poll_makes_one_query_once_token_and_gate_are_cached(
    fleet, admin_user, token_factory, django_assert_num_queries
):
    secret = token_factory(admin_user, label="poll")
    client = Client()
    first = client.get("/api/v1/gates/src-a/rl-a", **bearer(secret))  # caches both
    # One indexed read per poll: the copy is used only at the revision the database committed.
    with django_assert_num_queries(2):
        again = client.get("/api/v1/gates/src-a/rl-a", **bearer(secret))
        unchanged = client.get(
            "/api/v1/gates/src-a/rl-a", HTTP_IF_NONE_MATCH=first["ETag"], **bearer(secret)
        )
    assert again.status_code == 200 and again.json() == first.json()
    assert again["ETag"] == first["ETag"]
    assert unchanged.status_code == 304 and unchanged.content == b""


def test_unknown_namespace_and_source_are_404(fleet, viewer_client):
    assert viewer_client.get("/api/v1/gates/src-a/nope").status_code == 404
    missing = viewer_client.get("/api/v1/gates/nope/rl-a")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/workers?limit=0",
        "/api/v1/workers/99999999999999999999",
        "/api/v1/nothing-here",
        "/api/v1/workers?state=bogus",
    ],
)
def test_bad_input_is_4xx_with_the_error_body(fleet, viewer_client, path):
    response = viewer_client.get(path)
    assert 400 <= response.status_code < 500
    assert set(response.json()["error"]) == {"code", "message", "details"}


def test_a_source_declares_its_backend_family_and_dynamo_release(fleet, admin_client):
    response = admin_client.patch(
        "/api/v1/sources/src-a",
        {"declared_families": {"rl-a": "vllm-sidecar"}, "dynamo_release": "1.7"},
        content_type="application/json",
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["declared_families"], body["dynamo_release"]) == ({"rl-a": "vllm-sidecar"}, "1.7")
    refused = admin_client.patch(
        "/api/v1/sources/src-a",
        {"declared_family": "tgi", "dynamo_release": "9.9"},
        content_type="application/json",
    )
    assert refused.status_code == 422  # the API's validation refusal
    text = refused.content.decode()
    assert "declared family 'tgi' is unknown" in text
    assert "unknown Dynamo release '9.9'" in text
    assert admin_client.get("/api/v1/sources/src-a").json()["dynamo_release"] == "1.7"
