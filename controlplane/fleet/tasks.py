"""Celery tasks for discovery and serving health: thin adapters that call the services."""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from controlplane import jobs
from controlplane.fleet import serving_health
from controlplane.fleet.discovery import run_discovery
from controlplane.fleet.models import DiscoveryTrigger, Source
from controlplane.fleet.services import RUN_DISCOVERY_TASK


@shared_task(name=RUN_DISCOVERY_TASK, ignore_result=True)
def run_discovery_task(source_id: int, trigger: str = DiscoveryTrigger.SCHEDULE.value) -> None:
    run_discovery(source_id, trigger=trigger, wait=0.0)


@shared_task(name="fleet.schedule_discoveries", ignore_result=True)
def schedule_discoveries() -> int:
    """Beat tick: one discovery task per enabled source that is due and not claimed.

    This pre-filter only saves work; the discovery's own claim is what prevents doubling.
    """
    now = timezone.now()
    due = 0
    for source in Source.objects.filter(enabled=True).only(
        "pk", "discovery_interval_seconds", "last_discovery_started_at", "discovery_claimed_until"
    ):
        if source.discovery_claimed_until and source.discovery_claimed_until > now:
            continue
        if not source.is_due(now):
            continue
        # A task that waits longer than the interval is dropped, not run late and doubled.
        jobs.send(
            RUN_DISCOVERY_TASK,
            source.pk,
            DiscoveryTrigger.SCHEDULE.value,
            expires=max(source.discovery_interval_seconds, 1.0),
        )
        due += 1
    return due


@shared_task(name=serving_health.SAMPLE_TASK, ignore_result=True)
def sample_serving_health() -> int:
    """Beat tick: one serving health point per enabled source with a frontend URL."""
    return serving_health.sample_all()


# The names these tasks had before the fleet side said "discovery": messages queued under them
# by a process of the previous release (a rolling upgrade) still run. Remove in the next one.
shared_task(name="fleet.refresh_source", ignore_result=True)(run_discovery_task.run)
shared_task(name="fleet.schedule_discovery_refreshes", ignore_result=True)(schedule_discoveries.run)
