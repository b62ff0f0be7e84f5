"""The watch after a reopen acts: one admitted worker made to error after the refresh
succeeded is quarantined within the template's window, and the others stay admitted."""

from __future__ import annotations

from datetime import timedelta

import pytest

from controlplane.jsonshapes import problems
from controlplane.refresh.executor import execute_refresh
from controlplane.refresh.intents.analysis import run_canary_analysis
from controlplane.refresh.intents.watch import watch_reopened
from controlplane.refresh.models import (
    AnalysisPhase,
    CanaryAnalysis,
    Gate,
    PolicyRefresh,
    Quarantine,
    RefreshState,
    WatchReport,
)
from controlplane.simfleet import Fault
from tests.integration.canary_analysis.helpers import canary, lineage_fleet_config, save
from tests.integration.refresh.helpers import make_source, run_inline

pytestmark = pytest.mark.django_db

WINDOW = {"window_seconds": 120, "interval_seconds": 10, "sample_prompts": 2}


def test_a_worker_erroring_after_the_reopen_is_quarantined_within_the_window(
    simfleet_factory, operator, admin_user
):
    fleet = simfleet_factory(lineage_fleet_config(6))
    source = make_source(fleet)
    assert run_inline(source, operator, "v1").state == RefreshState.SUCCEEDED
    save(source, admin_user, background=WINDOW)
    refresh = run_inline(source, operator, "v2", strategy=canary())
    assert refresh.state == RefreshState.CANARY_REVIEW, refresh.held_reason
    run_canary_analysis(refresh.pk)
    execute_refresh(refresh.pk)
    refresh.refresh_from_db()
    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason

    # The watch's clock: each tick one interval after the last (the beat's own clock in
    # production; here moved by hand, so nothing waits for real seconds).
    reopened = refresh.finished_at
    ticks = iter(range(1, 100))

    def tick():
        return watch_reopened(now=reopened + timedelta(seconds=11 * next(ticks)))

    # A healthy tick first: every sampled worker answers, nobody is quarantined.
    tick()
    watch = CanaryAnalysis.objects.get(refresh=refresh, phase=AnalysisPhase.BACKGROUND)
    assert watch.report["tick_count"] == 1 and not watch.report["breaches"]
    assert not Quarantine.objects.exists()

    bad = sorted(w["key"] for w in fleet.workers())[0]
    bad_instance = next(w["instance_id"] for w in fleet.workers() if w["key"] == bad)
    fleet.inject(bad, "generate", Fault.http(500))

    # The sampled slice rotates over the admitted workers: within the window's ticks the bad
    # one is sampled, found failing and quarantined.
    q = None
    while q is None:
        did = tick()
        assert refresh.pk in did, "the window closed before the worker was quarantined"
        assert not did[refresh.pk].startswith("window closed"), did
        q = Quarantine.objects.filter(instance_id=str(bad_instance)).first()
    assert q.kind == "unhealthy", q
    assert "failed" in q.detail
    gate = Gate.objects.get(source=source, namespace=q.namespace)
    assert str(bad_instance) not in [str(i) for i in gate.verified_instances]
    assert Quarantine.objects.count() == 1  # the healthy ones stay admitted
    watch.refresh_from_db()
    assert [b["key"] for b in watch.report["breaches"]] == [q.key]
    assert problems(watch.report, WatchReport) == []


def test_a_fleet_wide_breach_rolls_back_when_the_template_says_so(
    simfleet_factory, operator, admin_user
):
    fleet = simfleet_factory(lineage_fleet_config(6))
    source = make_source(fleet)
    assert run_inline(source, operator, "v1").state == RefreshState.SUCCEEDED
    save(source, admin_user, background={**WINDOW, "on_fleet_breach": "rollback"})
    refresh = run_inline(source, operator, "v2", strategy=canary())
    run_canary_analysis(refresh.pk)
    execute_refresh(refresh.pk)
    refresh.refresh_from_db()
    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason

    for worker in fleet.workers():
        fleet.inject(worker["key"], "generate", Fault.http(500))
    did = watch_reopened(now=refresh.finished_at + timedelta(seconds=11))
    assert "rolling back with policy refresh" in did[refresh.pk], did

    # The rollback is a refresh of its own, back to the policy before, started (not only
    # planned); the workers are not quarantined one by one.
    rollback = PolicyRefresh.objects.exclude(pk__in=[refresh.pk]).order_by("-pk").first()
    assert rollback is not None and str(rollback.weight_version) == "v1"
    assert rollback.state not in (RefreshState.PLANNED, RefreshState.ABORTED)
    assert not Quarantine.objects.exists()
    watch = CanaryAnalysis.objects.get(refresh=refresh, phase=AnalysisPhase.BACKGROUND)
    assert watch.report["ticks"][-1]["fleet_wide"] is True
