"""The JSON API's strategy surfaces: a plan body's `strategy` validated with field errors
(400), the strategy and canary in the refresh answer, and `POST .../canary_verdict` (bearer
token with operate_policy_refresh; 409 on another version or when no canary waits)."""

import pytest

from controlplane.audit.models import AuditEvent
from controlplane.refresh.models import PolicyRefresh, RefreshState
from tests.api.conftest import bearer

pytestmark = pytest.mark.django_db


def awaiting(source, evaluation="trainer") -> PolicyRefresh:
    return PolicyRefresh.objects.create(
        source=source,
        namespaces=["rl-a"],
        target={"weight_version": "v7", "method": "disk", "model_path": "/m"},
        state=RefreshState.CANARY_REVIEW,
        strategy={"kind": "canary", "canary": {"size": 1, "evaluation": evaluation}},
        waves=2,
        progress={"canary": {"state": "awaiting", "evaluation": evaluation, "instances": {}}},
    )


def post_verdict(client, refresh, token, **data):
    body = {"weight_version": "v7", "passed": False, **data}
    return client.post(
        f"/api/v1/refreshes/{refresh.pk}/canary_verdict",
        body,
        content_type="application/json",
        **bearer(token),
    )


def test_a_trainer_token_records_a_verdict_once(client, fleet, operator, token_factory):
    token = token_factory(operator, label="trainer")
    refresh = awaiting(fleet["a"])
    answer = post_verdict(client, refresh, token, metrics={"reward": 0.2}, reason="worse")
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body["state"] == "canary_rollback"
    assert body["canary"]["verdict"] == "failed"
    assert body["canary"]["metrics"] == {"reward": 0.2}
    assert body["strategy"]["kind"] == "canary"
    assert "judged by the trainer" in body["strategy"]["description"]
    event = AuditEvent.objects.get(action="policy_refresh.canary_failed")
    assert event.actor_label.startswith("token:trainer")

    # The same verdict again is a no-op; the opposite one is a conflict.
    assert post_verdict(client, refresh, token).status_code == 200
    assert post_verdict(client, refresh, token, passed=True).status_code == 409
    assert AuditEvent.objects.filter(action="policy_refresh.canary_failed").count() == 1


def test_a_verdict_on_another_version_is_a_conflict(client, fleet, operator, token_factory):
    token = token_factory(operator)
    refresh = awaiting(fleet["a"])
    answer = post_verdict(client, refresh, token, weight_version="v6")
    assert answer.status_code == 409
    assert answer.json()["error"]["code"] == "invalid_transition"
    refresh.refresh_from_db()
    assert refresh.state == RefreshState.CANARY_REVIEW


@pytest.mark.parametrize(
    ("evaluation", "why"), [("manual", "judged by a person"), ("none", "checks alone")]
)
def test_only_a_trainer_judged_canary_takes_a_trainers_verdict(
    client, fleet, operator, token_factory, evaluation, why
):
    token = token_factory(operator, label="trainer", sources=[fleet["a"]])
    refresh = awaiting(fleet["a"], evaluation)
    for passed in (True, False):
        answer = post_verdict(client, refresh, token, passed=passed)
        assert answer.status_code == 409, answer.content
        error = answer.json()["error"]
        assert error["code"] == "canary_not_trainer_judged"
        assert why in error["message"] and f"#{refresh.pk}" in error["message"]
    refresh.refresh_from_db()
    assert refresh.state == RefreshState.CANARY_REVIEW
    assert refresh.progress["canary"] == {
        "state": "awaiting",
        "evaluation": evaluation,
        "instances": {},
    }
    refused = AuditEvent.objects.filter(action="policy_refresh.canary_verdict_refused")
    assert refused.count() == 2
    assert all(e.details["refresh_id"] == refresh.pk for e in refused)
    assert (
        not AuditEvent.objects.filter(action__startswith="policy_refresh.canary_")
        .exclude(action="policy_refresh.canary_verdict_refused")
        .exists()
    )


def test_a_viewer_token_may_not_judge_a_canary(client, fleet, viewer, token_factory):
    token = token_factory(viewer)
    refresh = awaiting(fleet["a"])
    assert post_verdict(client, refresh, token).status_code == 403
    refresh.refresh_from_db()
    assert refresh.state == RefreshState.CANARY_REVIEW


def test_a_token_limited_to_another_source_cannot_see_the_refresh(
    client, fleet, operator, token_factory
):
    token = token_factory(operator, sources=[fleet["b"]])
    assert post_verdict(client, awaiting(fleet["a"]), token).status_code == 404


@pytest.mark.parametrize(
    ("strategy", "field"),
    [
        ({"kind": "waves"}, "strategy"),
        ({"kind": "waves", "max_unavailable": "150%"}, "strategy.max_unavailable"),
        ({"kind": "sideways"}, "strategy.kind"),
        ({"kind": "canary", "canary": {"size": 0}}, "strategy.canary.size"),
        ({"kind": "waves", "max_unavailable": 1, "pause_after": ["x"]}, "strategy.pause_after"),
        ({"kind": "all_at_once", "speed": 3}, "strategy"),
    ],
)
def test_a_plan_with_a_bad_strategy_is_400_with_field_errors(
    client, fleet, operator, token_factory, strategy, field
):
    token = token_factory(operator)
    answer = client.post(
        "/api/v1/refreshes",
        {
            "source": "src-a",
            "target": {"weight_version": "v9", "model_path": "/m"},
            "strategy": strategy,
        },
        content_type="application/json",
        **bearer(token),
    )
    assert answer.status_code == 400, answer.content
    error = answer.json()["error"]
    assert error["code"] == "invalid_strategy"
    assert list(error["details"]) == [field]
    assert PolicyRefresh.objects.filter(target__weight_version="v9").count() == 0


def test_the_openapi_schema_describes_the_strategy_and_the_verdict(client, fleet):
    schema = client.get("/api/v1/openapi.json").json()
    plan = schema["components"]["schemas"]["PlanIn"]["properties"]["strategy"]
    text = str(plan)
    for key in ("max_unavailable", "max_failed", "admit_as_verified", "pause_after", "canary"):
        assert key in text
    assert "/api/v1/refreshes/{refresh_id}/canary_verdict" in schema["paths"]


def test_a_source_default_strategy_through_the_api(client, fleet, admin_user, token_factory):
    token = token_factory(admin_user)
    bad = client.patch(
        "/api/v1/sources/src-a",
        {"default_strategy": {"kind": "waves"}, "require_approval": True},
        content_type="application/json",
        **bearer(token),
    )
    assert bad.status_code == 400
    assert list(bad.json()["error"]["details"]) == ["strategy"]
    fleet["a"].refresh_from_db()
    assert fleet["a"].default_strategy == {} and fleet["a"].require_approval is False

    good = client.patch(
        "/api/v1/sources/src-a",
        {"default_strategy": {"kind": "waves", "max_unavailable": "25%"}},
        content_type="application/json",
        **bearer(token),
    )
    assert good.status_code == 200, good.content
    assert good.json()["default_strategy"]["max_unavailable"] == "25%"
    back = client.patch(
        "/api/v1/sources/src-a",
        {"default_strategy": {}},
        content_type="application/json",
        **bearer(token),
    )
    assert back.json()["default_strategy"] == {}
    changes = AuditEvent.objects.filter(action="source.updated", target_id=str(fleet["a"].pk))
    assert changes.count() == 2
