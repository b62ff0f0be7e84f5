"""Every place that enqueues work survives a broker that refuses the send: the change it made
is committed and audited, the caller gets no error, the answer says the work was not queued,
and the refused send is counted (`controlplane.jobs`). The sweeps and ticks that pick the work
up again are tested with their rows (test_delivery_sweep.py, the fault suite)."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.db import transaction

from controlplane import jobs
from controlplane.accounts.tokens import create_token
from controlplane.audit.models import AuditEvent
from controlplane.audit.recorder import Actor
from controlplane.embedded.redis import free_port
from controlplane.fleet.models import Source
from controlplane.notify import emit
from controlplane.refresh.apps import on_discovery_finished
from controlplane.refresh.drills import runner
from tests.fixtures.broker import point_producer_at

pytestmark = pytest.mark.django_db(transaction=True)


def _dead_broker():
    return point_producer_at(f"redis://127.0.0.1:{free_port()}/0")


def test_run_discovery_with_the_broker_down_is_recorded_and_says_it_was_not_queued(operator):
    from django.test import Client

    source = Source.objects.create(
        name="src-a", listener_url="http://127.0.0.1:9/", allowed_networks=["127.0.0.0/8"]
    )
    _, secret = create_token(user=operator, label="t", actor=Actor.system("test"))
    client = Client(HTTP_AUTHORIZATION=f"Bearer {secret}")
    before = jobs.failed_sends()
    with _dead_broker():
        response = client.post(f"/api/v1/sources/{source.name}/refresh")
    assert response.status_code == 202, response.content
    body = response.json()
    assert body["queued"] is False and body["status"] == "accepted"
    assert "scheduled discovery" in body["recovery"]
    assert jobs.failed_sends() == before + 1
    assert AuditEvent.objects.filter(action="discovery.requested").count() == 1

    with point_producer_at(settings.CELERY_BROKER_URL):
        response = client.post(f"/api/v1/sources/{source.name}/refresh")
    assert response.status_code == 202
    assert response.json()["queued"] is True and response.json()["status"] == "queued"


def test_notification_drill_and_drift_sends_refused_by_the_broker_never_reach_the_caller():
    before = jobs.failed_sends()
    with _dead_broker():
        with transaction.atomic():
            emit.enqueue_delivery(424242)  # sent on commit, robustly
        runner.enqueue_drill(434343, countdown=1)
        on_discovery_finished(None, source_id=1, run_id=2, ok=True)
    assert jobs.failed_sends() == before + 3
