"""Beat-triggered refreshes through a real Celery worker and Redis."""

from __future__ import annotations

import pytest

from controlplane.fleet.models import DiscoveryRun, Source, Worker
from controlplane.fleet.tasks import run_discovery_task, schedule_discoveries
from tests.integration.fleet.conftest import wait_for

pytestmark = pytest.mark.celery


def test_beat_tick_discovers_workers_across_prefix_namespaces(celery_worker, simfleet, make_source):
    source = make_source(simfleet)
    disabled = make_source(simfleet, name="off", enabled=False)

    assert schedule_discoveries() == 1  # the beat task, as beat would call it

    run = wait_for(lambda: DiscoveryRun.objects.filter(source=source).first())
    assert run.ok and run.trigger == "schedule"
    namespaces = set(Worker.objects.filter(source=source).values_list("namespace", flat=True))
    assert namespaces == {"rl-a", "rl-b"}
    assert Worker.objects.filter(source=source).count() == 4
    assert not DiscoveryRun.objects.filter(source=disabled).exists()


def test_duplicate_ticks_do_not_double_run(celery_worker, simfleet, make_source):
    source = make_source(simfleet, discovery_interval_seconds=60)
    # Several ticks' worth of tasks arrive together (a late tick, or a second beat), and
    # the worker runs them on four threads at once.
    for _ in range(4):
        run_discovery_task.delay(source.pk, "schedule")
    schedule_discoveries()

    wait_for(lambda: DiscoveryRun.objects.filter(source=source, finished_at__isnull=False))
    wait_for(lambda: Source.objects.get(pk=source.pk).discovery_claimed_until is None)
    # A manual refresh queued behind them proves the queue has been worked through.
    run_discovery_task.delay(source.pk, "manual")
    wait_for(lambda: DiscoveryRun.objects.filter(source=source, trigger="manual").exists())
    assert DiscoveryRun.objects.filter(source=source, trigger="schedule").count() == 1


def test_run_discovery_runs_on_the_worker_after_commit(
    celery_worker, simfleet, make_source, operator
):
    from controlplane.audit.recorder import Actor
    from controlplane.fleet import services

    source = make_source(simfleet)
    services.request_discovery(source, actor=Actor.for_user(operator))
    run = wait_for(lambda: DiscoveryRun.objects.filter(source=source, trigger="manual").first())
    assert run.ok
