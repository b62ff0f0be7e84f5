"""`/api/v1/sources/<name>/analysis-templates`: list, read any version, PUT a new one. Bearer
tokens like every endpoint; a refused or bad PUT stores nothing and a token's attempt is on
record (`api.request`)."""

from __future__ import annotations

import json

import pytest

from controlplane.analysis.models import AnalysisTemplate
from controlplane.audit.models import AuditEvent
from tests.api.conftest import bearer

pytestmark = pytest.mark.django_db

URL = "/api/v1/sources/src-a/analysis-templates"


def body(n: int = 20, **extra) -> dict:
    return {"prompts": [{"prompt": [i, 2, 3], "continuation": [4]} for i in range(n)], **extra}


def put(client, path, data, token=None):
    headers = bearer(token) if token else {}
    return client.put(path, json.dumps(data), content_type="application/json", **headers)


def test_put_creates_versions_and_get_reads_them(client, fleet, admin_user, token_factory):
    token = token_factory(admin_user, label="trainer")
    first = put(client, f"{URL}/held-out", {"body": body(), "note": "v1"}, token)
    assert first.status_code == 201, first.content
    answer = first.json()
    assert (answer["source"], answer["name"], answer["version"]) == ("src-a", "held-out", 1)
    assert answer["created_by"].startswith("token:trainer")
    assert answer["body"]["max_tokens"] == 16 and len(answer["body"]["judge"]["metrics"]) == 10
    second = put(client, f"{URL}/held-out", {"body": body(21)}, token)
    assert second.status_code == 201 and second.json()["versions"] == [2, 1]
    # The same body again: nothing written, the latest version answered.
    same = put(client, f"{URL}/held-out", {"body": second.json()["body"]}, token)
    assert same.status_code == 200 and same.json()["version"] == 2
    assert AnalysisTemplate.objects.count() == 2
    assert AuditEvent.objects.filter(action="analysis_template.saved").count() == 2

    latest = client.get(f"{URL}/held-out", **bearer(token)).json()
    assert latest["version"] == 2 and len(latest["body"]["prompts"]) == 21
    old = client.get(f"{URL}/held-out?version=1", **bearer(token)).json()
    assert old["version"] == 1 and old["note"] == "v1" and len(old["body"]["prompts"]) == 20
    listed = client.get(URL, **bearer(token)).json()
    assert listed["count"] == 1
    assert [(t["name"], t["version"], t["prompts"]) for t in listed["items"]] == [
        ("held-out", 2, 21)
    ]


def test_a_bad_body_is_a_400_naming_the_fields_and_stores_nothing(
    client, fleet, admin_user, token_factory
):
    token = token_factory(admin_user)
    bad = {"body": body(3, judge={"metrics": ["reward"], "pass_score": 101})}
    answer = put(client, f"{URL}/t", bad, token)
    assert answer.status_code == 400, answer.content
    error = answer.json()["error"]
    assert error["code"] == "invalid_template"
    assert {"judge.metrics[0].name", "judge.pass_score"} <= set(error["details"])
    assert "unknown metric" in error["details"]["judge.metrics[0].name"][0]
    bad_name = put(client, "/api/v1/sources/src-a/analysis-templates/Bad!", {"body": body()}, token)
    assert bad_name.status_code in (400, 404)
    not_an_object = put(client, f"{URL}/t", {"body": []}, token)
    assert not_an_object.status_code == 422
    assert not AnalysisTemplate.objects.exists()
    assert not AuditEvent.objects.filter(action="analysis_template.saved").exists()


def test_auth_and_permissions(client, fleet, admin_user, viewer, token_factory):
    assert client.get(URL).status_code == 401
    assert put(client, f"{URL}/t", {"body": body()}).status_code == 401
    bad = client.get(URL, HTTP_AUTHORIZATION="Bearer cpt_nope")
    assert bad.status_code == 401 and bad.json()["error"]["code"] == "unauthenticated"
    viewer_token = token_factory(viewer, label="reader")
    assert client.get(URL, **bearer(viewer_token)).status_code == 200
    refused = put(client, f"{URL}/t", {"body": body()}, viewer_token)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"
    assert not AnalysisTemplate.objects.exists()
    # The refused attempt is on record, made by the token.
    attempt = AuditEvent.objects.get(action="api.request")
    assert attempt.details["status"] == 403 and attempt.details["method"] == "PUT"
    assert not AuditEvent.objects.filter(action="analysis_template.saved").exists()


def test_a_limited_token_sees_only_its_sources(client, fleet, admin_user, token_factory):
    token = token_factory(admin_user, label="b-only", sources=[fleet["b"]])
    assert put(client, f"{URL}/t", {"body": body()}, token).status_code == 404
    assert client.get(URL, **bearer(token)).status_code == 404
    ok = put(client, "/api/v1/sources/src-b/analysis-templates/t", {"body": body()}, token)
    assert ok.status_code == 201
    assert AnalysisTemplate.objects.get().source == fleet["b"]


def test_unknown_template_or_version_is_a_404(client, fleet, admin_user, token_factory):
    token = token_factory(admin_user)
    assert client.get(f"{URL}/nope", **bearer(token)).status_code == 404
    put(client, f"{URL}/t", {"body": body()}, token)
    missing = client.get(f"{URL}/t?version=2", **bearer(token))
    assert missing.status_code == 404 and "version 2" in missing.json()["error"]["message"]
    assert client.get(f"{URL}/t?version=0", **bearer(token)).status_code == 422
    assert (
        client.get("/api/v1/sources/nowhere/analysis-templates", **bearer(token)).status_code == 404
    )
