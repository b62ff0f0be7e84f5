"""Retention: which old rows `manage.py purge` (and beat's hourly run) may delete, and deleting
them with an audit row per batch.

Kept apart per kind, each with its own setting (days; 0 keeps that kind forever):

- worker_events, discovery_runs (OBSERVATION_RETENTION_DAYS): older than the cutoff; a run
  that is the plan's discovery run of a live refresh stays;
- journal_entries (JOURNAL_RETENTION_DAYS): their policy refresh finished (a terminal state)
  before the cutoff;
- webhook_deliveries (WEBHOOK_RETENTION_DAYS): received before the cutoff, done (an outcome),
  and not tied to a live refresh;
- notification_deliveries (NOTIFICATION_RETENTION_DAYS): created before the cutoff, delivered
  or failed (never pending or retrying); their attempts go with them.

Never deleted: audit rows (the chain must stay whole), policy refreshes themselves, gates,
workers, sources, and anything a refresh that is still active (executing, awaiting approval or
held) reads. Rows go in batches, each batch and its `retention.purged` audit row in one
transaction, so a long purge never holds locks for long and a crash leaves it half done but
consistent.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import models, transaction
from django.utils import timezone

from controlplane.audit.actions import AuditAction
from controlplane.audit.recorder import Actor, record
from controlplane.fleet.models import DiscoveryRun, WorkerEvent
from controlplane.intake.models import DeliveryState, ReceivedWebhook
from controlplane.notify.models import DeliveryStatus, NotificationDelivery
from controlplane.refresh.models import ACTIVE_STATES, TERMINAL_STATES, JournalEntry, PolicyRefresh

BATCH_SIZE = 5000


def _live_refreshes() -> models.QuerySet[PolicyRefresh]:
    return PolicyRefresh.objects.filter(state__in=ACTIVE_STATES)


def _worker_events(cutoff: datetime) -> models.QuerySet:
    return WorkerEvent.objects.filter(occurred_at__lt=cutoff)


def _discovery_runs(cutoff: datetime) -> models.QuerySet:
    needed = _live_refreshes().exclude(discovery_run=None).values("discovery_run")
    return DiscoveryRun.objects.filter(started_at__lt=cutoff).exclude(pk__in=needed)


def _journal_entries(cutoff: datetime) -> models.QuerySet:
    return JournalEntry.objects.filter(
        refresh__state__in=TERMINAL_STATES, refresh__finished_at__lt=cutoff
    )


def _webhook_deliveries(cutoff: datetime) -> models.QuerySet:
    live = _live_refreshes().values("pk")
    return (
        ReceivedWebhook.objects.filter(state=DeliveryState.DONE, received_at__lt=cutoff)
        .exclude(refresh_id__in=live)
        .order_by()
    )


def _notification_deliveries(cutoff: datetime) -> models.QuerySet:
    return NotificationDelivery.objects.filter(
        status__in=(DeliveryStatus.DELIVERED, DeliveryStatus.FAILED), created_at__lt=cutoff
    ).order_by()


@dataclass(frozen=True)
class Kind:
    name: str
    setting: str
    expired: Callable[[datetime], models.QuerySet]

    @property
    def days(self) -> int:
        return int(getattr(settings, self.setting))

    def cutoff(self, now: datetime) -> datetime | None:
        return now - timedelta(days=self.days) if self.days > 0 else None


#: In deletion order: events before the runs they point at.
KINDS = (
    Kind("worker_events", "OBSERVATION_RETENTION_DAYS", _worker_events),
    Kind("discovery_runs", "OBSERVATION_RETENTION_DAYS", _discovery_runs),
    Kind("journal_entries", "JOURNAL_RETENTION_DAYS", _journal_entries),
    Kind("webhook_deliveries", "WEBHOOK_RETENTION_DAYS", _webhook_deliveries),
    Kind("notification_deliveries", "NOTIFICATION_RETENTION_DAYS", _notification_deliveries),
)


@dataclass(frozen=True)
class KindReport:
    name: str
    days: int
    cutoff: datetime | None
    rows: int  # expired rows (dry run) or rows deleted (applied), cascades not included


def pending(now: datetime | None = None) -> list[KindReport]:
    """What a purge would delete now, per kind (counts only; changes nothing)."""
    now = now or timezone.now()
    reports = []
    for kind in KINDS:
        cutoff = kind.cutoff(now)
        count = kind.expired(cutoff).count() if cutoff else 0
        reports.append(KindReport(kind.name, kind.days, cutoff, count))
    return reports


def purge(
    *, actor: Actor, now: datetime | None = None, batch_size: int = BATCH_SIZE
) -> list[KindReport]:
    """Delete every expired row, one audited batch per transaction."""
    now = now or timezone.now()
    reports = []
    for kind in KINDS:
        cutoff = kind.cutoff(now)
        deleted = 0
        while cutoff is not None:
            batch = _delete_batch(kind, cutoff, actor=actor, batch_size=batch_size)
            deleted += batch
            if batch < batch_size:
                break
        reports.append(KindReport(kind.name, kind.days, cutoff, deleted))
    return reports


def _delete_batch(kind: Kind, cutoff: datetime, *, actor: Actor, batch_size: int) -> int:
    with transaction.atomic():
        expired = kind.expired(cutoff)
        ids = list(expired.order_by().values_list("pk", flat=True)[:batch_size])
        if not ids:
            return 0
        _, per_model = expired.model._default_manager.filter(pk__in=ids).delete()
        record(
            AuditAction.RETENTION_PURGED,
            actor=actor,
            target=("retention", kind.name, kind.name.replace("_", " ")),
            details={
                "kind": kind.name,
                "deleted": len(ids),
                "rows_by_model": dict(sorted(per_model.items())),
                "older_than": cutoff.isoformat(),
                "retention_days": kind.days,
            },
        )
        return len(ids)
