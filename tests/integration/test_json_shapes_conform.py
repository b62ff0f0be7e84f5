"""The JSON the control plane really stores fits the shapes it declares (`controlplane/
jsonshapes.py`).

A realistic run on the simulated fleet with PostgreSQL and a real Celery worker — a refresh all
at once, a staged refresh in waves with declared versions and a trainer fingerprint, a
trainer's signed checkpoint webhook that starts a canary refresh (endpoint with approval rules
and its own strategy) and the trainer's signed verdict on it, and a drift that is quarantined,
caught up and admitted — then every stored value of every registered
column is checked by the validator: required keys present, no key the shape does not declare,
values of the declared JSON types, nested shapes and list elements alike. A writer that adds
an undeclared key fails here (`tests/unit/test_json_shapes.py` proves the validator does).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest
from django.apps import apps

from controlplane.audit.recorder import Actor
from controlplane.intake import services as intake_services
from controlplane.intake.models import DeliveryState, ReceivedWebhook, WebhookPolicy
from controlplane.jsonshapes import SHAPES, problems
from controlplane.refresh import intents
from controlplane.refresh.models import (
    Gate,
    PolicyRefresh,
    Quarantine,
    QuarantineState,
    RefreshState,
)
from controlplane.simfleet.tokens import expected_completion_ids
from tests.integration.drift.test_drift_quarantine import (
    detected_within_two_discoveries,
    restart_one,
)
from tests.integration.intake.conftest import post_webhook
from tests.integration.refresh.helpers import actor_for, fleet_config, make_source, plan

pytestmark = pytest.mark.celery

ENDED = {RefreshState.SUCCEEDED, RefreshState.HELD, RefreshState.FAILED, RefreshState.ABORTED}

#: Columns the scenario must have written something into, or the check proves little.
EXERCISED = (
    "audit.AuditEvent.details",
    "fleet.Source.allowed_networks",
    "fleet.Worker.routes",
    "fleet.Worker.weight_version",
    "fleet.WorkerEvent.details",
    "fleet.PublishedPolicy.version",
    "refresh.PolicyRefresh.fingerprint",
    "refresh.PolicyRefresh.target",
    "refresh.PolicyRefresh.verification",
    "refresh.PolicyRefresh.strategy",
    "refresh.PolicyRefresh.compat",
    "refresh.PolicyRefresh.progress",
    "refresh.PolicyRefresh.plan_membership",
    "refresh.PlannedWorker.calls",
    "refresh.JournalEntry.request_body",
    "refresh.Gate.admitted",
    "refresh.Gate.verified_policy",
    "refresh.Gate.verified_instances",
    "refresh.ServingInterval.evidence_detail",
    "refresh.ServingInterval.journal_ids",
    "refresh.Quarantine.target",
    "refresh.QuarantineCall.request_body",
    "intake.WebhookEndpoint.secrets",
    "intake.WebhookEndpoint.rules",
    "intake.WebhookEndpoint.default_strategy",
    "intake.ReceivedWebhook.payload",
    "intake.ReceivedWebhook.response",
)


def wait_for[T](predicate: Callable[[], T], *, timeout: float = 90.0, what: str = "") -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(0.05)


def ended(refresh_id: int) -> PolicyRefresh:
    refresh = wait_for(
        lambda: PolicyRefresh.objects.filter(pk=refresh_id, state__in=ENDED).first(),
        what=f"policy refresh {refresh_id} to end",
    )
    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    return refresh


def stored_values(column: str) -> list:
    app_label, model_name, field = column.split(".")
    model = apps.get_model(app_label, model_name)
    return list(model.objects.values_list(field, flat=True))


def nonconforming() -> dict[str, list[str]]:
    """Every registered column's stored values checked against its shape."""
    found: dict[str, list[str]] = {}
    for column, shape in SHAPES.items():
        for value in stored_values(column):
            wrong = problems(value, shape)
            if wrong:
                found.setdefault(column, []).extend(wrong[:5])
    return found


def written(columns) -> set[str]:
    return {c for c in columns if any(v not in (None, [], {}) for v in stored_values(c))}


def test_every_stored_json_value_fits_its_declared_shape(
    simfleet_factory, operator, client, celery_worker
):
    fleet = simfleet_factory(fleet_config(6))
    source = make_source(fleet)
    actor = actor_for(operator)

    # All at once to v1, then waves of one worker per namespace to v2, versions declared.
    first = plan(source, operator, "v1")
    intents.start_policy_refresh(first, actor=actor)
    ended(first.pk)
    staged = plan(
        source,
        operator,
        "v2",
        strategy={"kind": "waves", "max_unavailable": 1},
        versions={"dynamo": "1.6.1", "trainer": "run-7"},
        fingerprint={"completion_token_ids": expected_completion_ids("v2", [5, 6, 7, 8], 4)},
    )
    assert not staged.plan_blockers, staged.plan_blockers
    assert staged.waves > 1
    intents.start_policy_refresh(staged, actor=actor)
    ended(staged.pk)

    # A trainer's signed checkpoint starts the next refresh through an endpoint of its own, a
    # canary the trainer judges; its signed verdict lets the refresh go on.
    endpoint, secret = intake_services.create_webhook_endpoint(
        actor=Actor.system("test setup"),
        name="trainer-run-7",
        source=source,
        policy=WebhookPolicy.AUTO_START,
        rules=[{"metric": "eval/reward", "op": "lt", "value": 0.2}],
        default_strategy={
            "kind": "canary",
            "canary": {"size": 1, "evaluation": "trainer"},
            "max_unavailable": 1,
        },
    )
    body = json.dumps(
        {
            "type": "checkpoint.ready",
            "data": {
                "weight_version": "v3",
                "model_path": "/checkpoints/run-7/v3",
                "step": 1300,
                "metrics": {"eval/reward": 0.61},
            },
        }
    ).encode()
    response = post_webhook(
        client, body, secret=secret, webhook_id="msg_shapes_1", endpoint=endpoint.name
    )
    assert response.status_code == 202, response.content
    delivery = wait_for(
        lambda: ReceivedWebhook.objects.filter(
            webhook_id="msg_shapes_1", state=DeliveryState.DONE
        ).first(),
        what="the checkpoint delivery to be processed",
    )
    assert delivery.refresh_id is not None, delivery.detail
    wait_for(
        lambda: PolicyRefresh.objects.filter(
            pk=delivery.refresh_id, state=RefreshState.CANARY_REVIEW
        ).first(),
        what="the canary to await the trainer's verdict",
    )
    verdict = {
        "refresh_id": delivery.refresh_id,
        "weight_version": "v3",
        "passed": True,
        "metrics": {"eval/reward": 0.64},
    }
    response = post_webhook(
        client,
        json.dumps({"type": "canary.verdict", "data": verdict}).encode(),
        secret=secret,
        webhook_id="msg_shapes_2",
        endpoint=endpoint.name,
    )
    assert response.status_code == 200, response.content
    ended(delivery.refresh_id)

    # A restarted worker drifts: quarantined (its gate lists it), caught up alone, admitted.
    _, new_id = restart_one(fleet)
    q = detected_within_two_discoveries(
        source, lambda: Quarantine.objects.filter(source=source, instance_id=new_id).first()
    )
    assert Gate.objects.filter(source=source, drift__0__instance_id=new_id).exists()
    assert written(["refresh.Gate.drift"]) == {"refresh.Gate.drift"}
    assert nonconforming() == {}

    wait_for(
        lambda: Quarantine.objects.filter(pk=q.pk, state=QuarantineState.ADMITTED).first(),
        what="the drifted worker to be caught up and admitted",
    )
    assert nonconforming() == {}
    assert sorted(set(EXERCISED) - written(EXERCISED)) == []
