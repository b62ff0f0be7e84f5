"""`manage.py purge`: dry run by default, deletes only expired rows nobody live needs, audited."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone

from controlplane.audit.actions import AuditAction
from controlplane.audit.chain import verify_chain
from controlplane.audit.models import AuditChainHead, AuditEvent
from controlplane.audit.recorder import Actor, record
from controlplane.fleet.models import DiscoveryRun, Source, Worker, WorkerEvent
from controlplane.intake.models import DeliveryState, ReceivedWebhook, WebhookEndpoint
from controlplane.notify.models import (
    DeliveryStatus,
    NotificationAttempt,
    NotificationDelivery,
    NotificationDestination,
)
from controlplane.ops import retention
from controlplane.ops.tasks import purge_expired
from controlplane.refresh.models import JournalEntry, PolicyRefresh, RefreshState

pytestmark = pytest.mark.django_db
DISK = {"weight_version": "v2", "method": "disk", "model_path": "/ckpt/v2"}


@pytest.fixture
def aged():
    """One old and one fresh row of every kind, plus old rows a live refresh still needs."""
    now = timezone.now()
    old, fresh = now - timedelta(days=400), now - timedelta(hours=1)
    source = Source.objects.create(
        name="fleet-a", listener_url="http://10.0.0.1:8001", allowed_networks=["10.0.0.0/8"]
    )
    worker = Worker.objects.create(
        source=source,
        namespace="rl-a",
        component="backend",
        endpoint="generate",
        instance_id="1",
        first_seen_at=old,
        last_seen_at=now,
    )
    rows = {}
    for age, when in (("old", old), ("fresh", fresh)):
        run = DiscoveryRun.objects.create(source=source, trigger="schedule", started_at=when)
        WorkerEvent.objects.create(
            source=source, worker=worker, run=run, occurred_at=when, kind="joined"
        )
        rows[f"run_{age}"] = run
    # An old discovery run that a held refresh planned from: it must stay.
    planned_from = DiscoveryRun.objects.create(source=source, trigger="manual", started_at=old)
    held = PolicyRefresh.objects.create(
        source=source,
        namespaces=["rl-a"],
        target=DISK,
        state=RefreshState.HELD,
        discovery_run=planned_from,
    )
    finished_old = PolicyRefresh.objects.create(
        source=source,
        namespaces=["rl-b"],
        target=DISK,
        state=RefreshState.SUCCEEDED,
        finished_at=old,
    )
    finished_fresh = PolicyRefresh.objects.create(
        source=source,
        namespaces=["rl-c"],
        target=DISK,
        state=RefreshState.SUCCEEDED,
        finished_at=fresh,
    )
    for refresh in (held, finished_old, finished_fresh):
        JournalEntry.objects.create(
            refresh=refresh,
            step="pause",
            operation="pause",
            method="POST",
            url="http://10.0.0.2:9090/engine/pause",
            ok=True,
            duration_ms=1.0,
            started_at=old,
            finished_at=old,
            lease_token=1,
        )
    endpoint = WebhookEndpoint.objects.create(name="trainer", source=source, secrets=["x"])
    for webhook_id, state, refresh_id in (
        ("done-old", DeliveryState.DONE, finished_old.pk),
        ("done-live", DeliveryState.DONE, held.pk),
        ("retryable-old", DeliveryState.RETRYABLE, None),
        ("done-fresh", DeliveryState.DONE, None),
    ):
        hook = ReceivedWebhook.objects.create(
            endpoint=endpoint,
            webhook_id=webhook_id,
            event_type="x",
            state=state,
            refresh_id=refresh_id,
        )
        when = fresh if webhook_id == "done-fresh" else old
        ReceivedWebhook.objects.filter(pk=hook.pk).update(received_at=when)
    destination = NotificationDestination.objects.create(
        name="ops", kind="webhook", url="http://10.0.0.9/hook"
    )
    for message_id, status in (
        ("delivered-old", DeliveryStatus.DELIVERED),
        ("failed-old", DeliveryStatus.FAILED),
        ("retrying-old", DeliveryStatus.RETRYING),
        ("delivered-fresh", DeliveryStatus.DELIVERED),
    ):
        delivery = NotificationDelivery.objects.create(
            destination=destination, message_id=message_id, event="x", status=status
        )
        when = fresh if message_id.endswith("fresh") else old
        NotificationDelivery.objects.filter(pk=delivery.pk).update(created_at=when)
        NotificationAttempt.objects.create(delivery=delivery, number=1, attempted_at=when, ok=True)
    record(AuditAction.SOURCE_CREATED, actor=Actor.system("t"), target=source)
    rows.update(held=held, finished_old=finished_old, planned_from=planned_from)
    return rows


def _purge(*args: str) -> str:
    out = StringIO()
    call_command("purge", *args, stdout=out)
    return out.getvalue()


def _counts() -> dict[str, int]:
    return {
        "events": WorkerEvent.objects.count(),
        "runs": DiscoveryRun.objects.count(),
        "journal": JournalEntry.objects.count(),
        "webhooks": ReceivedWebhook.objects.count(),
        "notifications": NotificationDelivery.objects.count(),
        "attempts": NotificationAttempt.objects.count(),
        "audit": AuditEvent.objects.count(),
        "refreshes": PolicyRefresh.objects.count(),
    }


def test_dry_run_counts_what_would_go_and_changes_nothing(aged):
    before = _counts()
    out = _purge()
    assert _counts() == before
    assert "dry run: nothing was deleted" in out
    lines = {line.split()[0]: line.split()[-1] for line in out.splitlines()[1:6]}
    assert lines == {
        "worker_events": "1",
        "discovery_runs": "1",
        "journal_entries": "1",
        "webhook_deliveries": "1",
        "notification_deliveries": "2",
    }


def test_apply_deletes_expired_rows_but_never_what_a_live_refresh_needs(aged):
    before = _counts()
    _purge("--apply")
    after = _counts()
    assert after["events"] == before["events"] - 1
    assert after["runs"] == before["runs"] - 1
    assert not DiscoveryRun.objects.filter(pk=aged["run_old"].pk).exists()
    assert DiscoveryRun.objects.filter(pk=aged["planned_from"].pk).exists()  # held refresh's
    assert set(JournalEntry.objects.values_list("refresh_id", flat=True)) == {
        aged["held"].pk,
        PolicyRefresh.objects.get(namespaces=["rl-c"]).pk,
    }
    assert set(ReceivedWebhook.objects.values_list("webhook_id", flat=True)) == {
        "done-live",
        "retryable-old",
        "done-fresh",
    }
    assert set(NotificationDelivery.objects.values_list("message_id", flat=True)) == {
        "retrying-old",
        "delivered-fresh",
    }
    assert after["attempts"] == 2  # went with their deliveries
    assert after["refreshes"] == before["refreshes"]  # refreshes themselves stay


def test_every_applied_batch_is_audited_and_old_audit_rows_stay(aged):
    old_audit = set(AuditEvent.objects.values_list("pk", flat=True))
    retention.purge(actor=Actor.system("test"), batch_size=1)
    purged = AuditEvent.objects.filter(action=AuditAction.RETENTION_PURGED)
    # One row per batch of one: 1 event + 1 run + 1 journal + 1 webhook + 2 notifications.
    assert purged.count() == 6
    kinds = sorted(e.details["kind"] for e in purged)
    assert kinds.count("notification_deliveries") == 2
    assert old_audit <= set(AuditEvent.objects.values_list("pk", flat=True))
    chain = AuditEvent.objects.order_by("sequence")
    assert verify_chain(chain, AuditChainHead.objects.filter(pk=1).first()).ok


def test_zero_days_keeps_a_kind_forever(aged, settings):
    settings.NOTIFICATION_RETENTION_DAYS = 0
    _purge("--apply")
    assert NotificationDelivery.objects.count() == 4
    assert "forever" in _purge()


def test_a_second_purge_finds_nothing_and_audits_nothing(aged):
    _purge("--apply")
    audited = AuditEvent.objects.count()
    out = _purge("--apply")
    assert AuditEvent.objects.count() == audited
    assert all(line.split()[-1] == "0" for line in out.splitlines()[1:6])


def test_beat_runs_the_purge_as_the_system(aged, settings):
    assert settings.CELERY_BEAT_SCHEDULE["retention-purge"]["task"] == "ops.purge_expired"
    assert purge_expired() == {
        "worker_events": 1,
        "discovery_runs": 1,
        "journal_entries": 1,
        "webhook_deliveries": 1,
        "notification_deliveries": 2,
    }
    labels = set(
        AuditEvent.objects.filter(action=AuditAction.RETENTION_PURGED).values_list(
            "actor_label", flat=True
        )
    )
    assert labels == {"retention"}
