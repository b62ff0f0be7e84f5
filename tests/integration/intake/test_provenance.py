"""The provenance trail of a weight version: a signed checkpoint webhook plans a refresh on the
simulated fleet, the executor applies it, and the page and the API join it all back together.
"""

from __future__ import annotations

import json

import pytest
from django.test import Client

from controlplane.intake.models import ReceivedWebhook, WebhookEndpoint, WebhookPolicy
from controlplane.intake.webhooks.trainer.process import process_delivery
from controlplane.refresh import intents
from controlplane.refresh.executor import execute_refresh
from controlplane.refresh.models import PolicyRefresh, RefreshState
from tests.integration.intake.conftest import SECRET, post_webhook
from tests.integration.refresh.helpers import actor_for, make_source, run_inline, sync_workers

pytestmark = pytest.mark.django_db(transaction=True)

DIGEST = "sha256:" + "ab" * 32


def checkpoint(version, step=1200) -> bytes:
    return json.dumps(
        {
            "type": "checkpoint.ready",
            "timestamp": "2026-01-01T12:00:00Z",
            "data": {
                "weight_version": version,
                "model_path": f"/checkpoints/run-7/{version}",
                "step": step,
                "metrics": {"eval/reward": 0.61, "train/loss": 1.83},
                "checkpoint_digest": DIGEST,
            },
        }
    ).encode()


@pytest.fixture
def applied(simfleet, approver):
    """`step-1200` delivered by a signed webhook and applied to the 4-worker fleet."""
    source = make_source(simfleet)
    sync_workers(source)
    WebhookEndpoint.objects.create(
        name="trainer-a", source=source, secrets=[SECRET], policy=WebhookPolicy.AUTO_START
    )
    answer = post_webhook(Client(), checkpoint("step-1200"), webhook_id="msg_prov_1")
    assert answer.status_code == 202, answer.content
    process_delivery(ReceivedWebhook.objects.get(webhook_id="msg_prov_1").pk)
    refresh = PolicyRefresh.objects.get(source=source)
    execute_refresh(refresh.pk)  # the executor, in this thread (the task is idempotent)
    refresh.refresh_from_db()
    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    return source, refresh


def test_api_joins_checkpoint_refresh_workers_and_admission(applied, viewer_client, simfleet):
    _source, refresh = applied
    response = viewer_client.get("/api/v1/versions/step-1200/provenance")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["weight_version"] == "step-1200"

    [cp] = body["checkpoints"]
    assert cp["webhook_id"] == "msg_prov_1"
    assert cp["step"] == 1200
    assert cp["checkpoint_digest"] == DIGEST
    assert cp["model_path"] == "/checkpoints/run-7/step-1200"
    assert cp["metrics"] == {"eval/reward": 0.61, "train/loss": 1.83}
    assert cp["refresh_id"] == refresh.pk and cp["outcome"] == "started"

    [applied_by] = body["refreshes"]
    assert applied_by["id"] == refresh.pk and applied_by["state"] == "succeeded"
    assert len(applied_by["workers"]) == 4
    assert all(w["verified"] for w in applied_by["workers"])
    assert {w["steps"]["update"] for w in applied_by["workers"]} == {"ok"}
    # A skipped flush carries a note ("the update already invalidates the cache"), not an error.
    assert {w["steps"]["flush"] for w in applied_by["workers"]} == {"skipped"}
    assert {w["error"] for w in applied_by["workers"]} == {""}
    instance_ids = {str(w["instance_id"]) for w in simfleet.workers()}
    verified = {iid for ids in applied_by["verified_instances"].values() for iid in ids}
    assert verified == instance_ids

    namespaces = set(refresh.namespaces)
    assert {w["namespace"] for w in body["admission"]} == namespaces
    for window in body["admission"]:
        assert window["open_now"] is True and window["closed_at"] is None
        assert window["refresh_id"] == refresh.pk and window["forced"] is False
    assert {g["namespace"] for g in body["gates"]} == namespaces


def test_admission_window_closes_when_the_next_version_is_applied(applied, operator):
    source, _first = applied
    second = run_inline(source, operator, version="step-1300")
    assert second.state == RefreshState.SUCCEEDED
    body = Client()
    body.force_login(operator)
    old = body.get("/api/v1/versions/step-1200/provenance").json()
    assert old["gates"] == []  # no gate is at step-1200 any more
    for window in old["admission"]:
        assert window["open_now"] is False
        assert window["closed_at"] is not None
        assert window["closed_reason"]  # "policy refresh #N to 'step-1300' …"
    new = body.get("/api/v1/versions/step-1300/provenance").json()
    assert new["checkpoints"] == []  # planned by a person, not a trainer
    assert [r["id"] for r in new["refreshes"]] == [second.pk]
    assert all(w["open_now"] for w in new["admission"])


def test_integer_versions_are_found_by_their_text(simfleet, operator, viewer_client):
    source = make_source(simfleet)
    sync_workers(source)
    refresh = intents.plan_policy_refresh(
        source=source,
        actor=actor_for(operator),
        target={"weight_version": 42, "method": "disk", "model_path": "/ckpt/42"},
    )
    body = viewer_client.get("/api/v1/versions/42/provenance").json()
    assert [r["id"] for r in body["refreshes"]] == [refresh.pk]
    assert body["refreshes"][0]["target"]["weight_version"] == 42


def test_unknown_version_is_404_in_the_api_error_format(viewer_client):
    response = viewer_client.get("/api/v1/versions/never-trained/provenance")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"
    assert viewer_client.get("/versions/never-trained/provenance/").status_code == 404


def test_page_shows_the_trail_to_a_viewer(applied, viewer_client):
    _source, refresh = applied
    response = viewer_client.get("/versions/step-1200/provenance/")
    assert response.status_code == 200
    html = response.content.decode()
    assert DIGEST in html and "msg_prov_1" in html and "eval/reward" in html
    assert f'id="refresh-{refresh.pk}"' in html
    assert html.count('class="worker-outcome verified"') == 4
    assert 'href="/api/v1/versions/step-1200/provenance"' in html  # the JSON export


def test_anonymous_is_sent_to_sign_in_and_the_api_refuses(applied):
    anonymous = Client()
    page = anonymous.get("/versions/step-1200/provenance/")
    assert page.status_code == 302 and "/accounts/login/" in page["Location"]
    assert anonymous.get("/api/v1/versions/step-1200/provenance").status_code == 401


def test_query_count_does_not_grow_with_refreshes(
    applied, operator, viewer_client, django_assert_max_num_queries
):
    source, _ = applied
    for _ in range(2):  # same version again: more refreshes, workers, results, gate events
        run_inline(source, operator, version="step-1200")
    with django_assert_max_num_queries(12):
        body = viewer_client.get("/api/v1/versions/step-1200/provenance").json()
    assert len(body["refreshes"]) == 3
    with django_assert_max_num_queries(14):
        assert viewer_client.get("/versions/step-1200/provenance/").status_code == 200


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("step-1200", '<a class="version-link" href="/versions/step-1200/provenance/"'),
        (1200, 'href="/versions/1200/provenance/"'),
        ("run/7", 'href="/versions/run/7/provenance/"'),
        ('<b x="1">', 'href="/versions/%3Cb%20x=%221%22%3E/provenance/"'),
        (None, "—"),
        ("a\nb", "<code>a\nb</code>"),  # no URL carries a line break: plain text
    ],
    ids=["text", "integer", "slash", "markup", "none", "line-break"],
)
def test_version_link_is_a_builtin_escaped_link(version, expected):
    from django.template import Context, Template

    html = Template("{{ v|version_link }}").render(Context({"v": version}))
    assert expected in html
    assert "<b " not in html


def test_a_held_refresh_names_the_failing_worker(simfleet, operator, viewer_client):
    from controlplane.simfleet import Fault

    source = make_source(simfleet)
    bad = simfleet.workers()[0]
    simfleet.inject(bad["key"], "update_weights_from_disk", Fault.error("disk full on the worker"))
    refresh = run_inline(source, operator, version="step-bad")
    assert refresh.state == RefreshState.HELD

    body = viewer_client.get("/api/v1/versions/step-bad/provenance").json()
    [trail] = body["refreshes"]
    failed = [w for w in trail["workers"] if w["steps"].get("update") == "failed"]
    assert [w["instance_id"] for w in failed] == [str(bad["instance_id"])]
    assert "disk full on the worker" in failed[0]["error"]
    assert failed[0]["verified"] is False
    assert body["admission"] == [] and body["gates"] == []  # no gate ever opened at it
    html = viewer_client.get("/versions/step-bad/provenance/").content.decode()
    assert "disk full on the worker" in html
    assert "No gate has admitted rollouts at this version." in html


def test_openapi_documents_the_provenance_answer(viewer_client):
    schema = viewer_client.get("/api/v1/openapi.json").json()
    operation = schema["paths"]["/api/v1/versions/{version}/provenance"]["get"]
    assert operation["tags"] == ["provenance"]
    answer = operation["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    fields = schema["components"]["schemas"][answer.rsplit("/", 1)[-1]]["properties"]
    assert set(fields) == {
        "weight_version",
        "generated_at",
        "checkpoints",
        "refreshes",
        "admission",
        "gates",
    }
