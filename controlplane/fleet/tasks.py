"""Celery tasks for discovery: thin adapters that take ids and call the services."""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from controlplane import jobs
from controlplane.fleet.discovery import refresh_source
from controlplane.fleet.models import DiscoveryTrigger, Source
from controlplane.fleet.services import REFRESH_SOURCE_TASK


@shared_task(name=REFRESH_SOURCE_TASK, ignore_result=True)
def refresh_source_task(source_id: int, trigger: str = DiscoveryTrigger.SCHEDULE.value) -> None:
    refresh_source(source_id, trigger=trigger, wait=0.0)


@shared_task(name="fleet.schedule_discovery_refreshes", ignore_result=True)
def schedule_discovery_refreshes() -> int:
    """Beat tick: one refresh task per enabled source that is due and not claimed.

    This pre-filter only saves work; the refresh's own claim is what prevents doubling.
    """
    now = timezone.now()
    due = 0
    for source in Source.objects.filter(enabled=True).only(
        "pk", "refresh_interval_seconds", "last_refresh_started_at", "refresh_claimed_until"
    ):
        if source.refresh_claimed_until and source.refresh_claimed_until > now:
            continue
        if not source.is_due(now):
            continue
        # A task that waits longer than the interval is dropped, not run late and doubled.
        jobs.send(
            REFRESH_SOURCE_TASK,
            source.pk,
            DiscoveryTrigger.SCHEDULE.value,
            expires=max(source.refresh_interval_seconds, 1.0),
        )
        due += 1
    return due
