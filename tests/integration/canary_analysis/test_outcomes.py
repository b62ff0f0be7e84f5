"""Each outcome of a canary analysis, produced on purpose on the simulated lineage and run the
way production runs it: the refresh and its analysis execute in a real Celery worker over real
Redis, the prompts go through the simulated frontend pinned per worker.

- a close successor (v1 -> v2 of one lineage) passes and the canary proceeds;
- a broken checkpoint (large drift) fails on a critical metric: only the canary is rolled back
  and the refresh holds; the baseline was never paused;
- a borderline checkpoint holds as marginal for a person, whose approve and reject both work
  (and a trainer's verdict is refused meanwhile).
"""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.test import Client

from controlplane.audit.models import AuditEvent
from controlplane.audit.recorder import Actor
from controlplane.jsonshapes import problems
from controlplane.refresh import intents
from controlplane.refresh.intents.canary import (
    TrainerVerdictRefused,
    approve_canary,
    record_canary_verdict,
    reject_canary,
)
from controlplane.refresh.models import (
    AnalysisPhase,
    CanaryAnalysis,
    CanaryReport,
    JournalEntry,
    PolicyRefresh,
    RefreshState,
)
from tests.integration.canary_analysis.helpers import (
    TEMPLATE,
    canary,
    lineage_fleet_config,
    save,
)
from tests.integration.refresh.helpers import (
    actor_for,
    fleet_versions,
    make_source,
    paused_workers,
    plan,
    run_inline,
    wait_for,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("celery_worker")]

#: The default metrics with the drift metrics made non-critical and the KL allowance widened:
#: the `marginal` checkpoint then fails `ref_logprob` alone, the drift group scores half and
#: the whole score lands at the marginal threshold (75), below the pass threshold (95).
BORDERLINE_JUDGE = {
    "metrics": [
        {
            "name": "ref_logprob",
            "direction": "decrease",
            "allowed_effect": 0.05,
            "critical": False,
            "group": "drift",
            "must_have_data": True,
        },
        {
            "name": "kl_estimate",
            "direction": "increase",
            "allowed_effect": 0.2,
            "critical": False,
            "group": "drift",
            "must_have_data": True,
        },
        {
            "name": "zero_tokens",
            "direction": "increase",
            "allowed_effect": 0,
            "critical": True,
            "group": "output",
            "must_have_data": False,
        },
        {
            "name": "bad_logprobs",
            "direction": "increase",
            "allowed_effect": 0,
            "critical": True,
            "group": "output",
            "must_have_data": False,
        },
        {
            "name": "error",
            "direction": "increase",
            "allowed_effect": 0,
            "critical": False,
            "group": "serving",
            "must_have_data": False,
        },
    ],
    "group_weights": {"drift": 0.5, "output": 0.3, "serving": 0.2},
    "pass_score": 95,
    "marginal_score": 75,
}


@pytest.fixture
def fleet(simfleet_factory):
    return simfleet_factory(lineage_fleet_config())


@pytest.fixture
def source(fleet, operator):
    source = make_source(fleet)
    first = run_inline(source, operator, "v1")
    assert first.state == RefreshState.SUCCEEDED, first.held_reason
    return source


def start(source, operator, strategy) -> PolicyRefresh:
    refresh = plan(source, operator, "v2", strategy=strategy)
    assert not refresh.plan_blockers, refresh.plan_blockers
    return intents.start_policy_refresh(refresh, actor=actor_for(operator))


def settled(refresh: PolicyRefresh, *states: str, timeout: float = 90.0) -> PolicyRefresh:
    def there():
        refresh.refresh_from_db()
        return refresh.state in states

    wait_for(there, timeout=timeout)
    assert refresh.state in states, (refresh.state, refresh.held_reason)
    return refresh


def analysis_of(refresh: PolicyRefresh) -> CanaryAnalysis:
    return CanaryAnalysis.objects.get(refresh=refresh, phase=AnalysisPhase.CANARY)


def canary_keys(refresh: PolicyRefresh) -> set[str]:
    return set(refresh.workers.filter(wave=1).values_list("key", flat=True))


def test_a_close_successor_passes_and_the_canary_proceeds(fleet, source, operator, admin_user):
    save(source, admin_user)
    refresh = settled(start(source, operator, canary()), RefreshState.SUCCEEDED, RefreshState.HELD)
    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    run = analysis_of(refresh)
    assert run.outcome == "pass", run.summary
    verdicts = {m["name"]: m["verdict"] for m in run.report["judge"]["metrics"]}
    assert verdicts["ref_logprob"] == verdicts["kl_estimate"] == "pass"
    assert set(fleet_versions(fleet).values()) == {"v2"}
    assert refresh.progress["canary"]["by"] == "canary analysis"
    # The stored report is the declared shape, all the way down.
    assert problems(run.report, CanaryReport) == []
    assert AuditEvent.objects.filter(
        correlation_id=refresh.correlation_id, action="policy_refresh.analysis_done"
    ).exists()


def test_a_broken_checkpoint_fails_on_a_critical_metric_and_only_the_canary_rolls_back(
    fleet, source, operator, admin_user
):
    save(source, admin_user)
    fleet.set_broken("v2", "drift")
    refresh = settled(start(source, operator, canary()), RefreshState.HELD, RefreshState.SUCCEEDED)
    assert refresh.state == RefreshState.HELD
    run = analysis_of(refresh)
    assert run.outcome == "fail"
    failed = {m["name"] for m in run.report["judge"]["metrics"] if m["verdict"] == "fail"}
    assert "ref_logprob" in failed and "kl_estimate" in failed
    assert "analysis failed" in refresh.held_reason
    # The canary went back to v1; everyone else still serves v1 and was never paused.
    assert set(fleet_versions(fleet).values()) == {"v1"}
    assert paused_workers(fleet) == []
    others = refresh.workers.exclude(wave=1)
    assert others.exists()
    assert not JournalEntry.objects.filter(
        refresh=refresh, planned_worker__in=others, operation="pause"
    ).exists()
    rolled_back = set(
        JournalEntry.objects.filter(refresh=refresh, step="canary_rollback", ok=True).values_list(
            "planned_worker__key", flat=True
        )
    )
    assert rolled_back == canary_keys(refresh)


def borderline(fleet, source, operator, admin_user) -> PolicyRefresh:
    save(source, admin_user, judge=BORDERLINE_JUDGE)
    fleet.set_broken("v2", "marginal")
    refresh = start(source, operator, canary("trainer"))

    def waiting_for_a_person():
        refresh.refresh_from_db()
        return (refresh.progress.get("canary") or {}).get("needs_person") or refresh.state in (
            RefreshState.HELD,
            RefreshState.SUCCEEDED,
        )

    wait_for(waiting_for_a_person, timeout=90)
    assert refresh.state == RefreshState.CANARY_REVIEW, refresh.held_reason
    run = analysis_of(refresh)
    assert run.outcome == "marginal", run.summary
    assert run.score == 75
    return refresh


def test_a_borderline_checkpoint_holds_for_a_person_who_approves(
    fleet, source, operator, admin_user
):
    refresh = borderline(fleet, source, operator, admin_user)
    keys = canary_keys(refresh)
    assert {k for k, v in fleet_versions(fleet).items() if v == "v2"} == keys
    # The trainer's verdict does not decide a marginal canary: a person does.
    with pytest.raises(TrainerVerdictRefused):
        record_canary_verdict(
            refresh, passed=True, actor=Actor.system("trainer"), weight_version="v2"
        )
    refresh.refresh_from_db()
    assert refresh.state == RefreshState.CANARY_REVIEW
    approve_canary(refresh, actor=actor_for(operator), reason="drift within what we expect")
    refresh = settled(refresh, RefreshState.SUCCEEDED, RefreshState.HELD)
    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    assert set(fleet_versions(fleet).values()) == {"v2"}


def test_a_borderline_checkpoint_holds_for_a_person_who_rejects(
    fleet, source, operator, admin_user
):
    refresh = borderline(fleet, source, operator, admin_user)
    with pytest.raises(ValidationError):
        reject_canary(refresh, actor=actor_for(operator), reason="")
    reject_canary(refresh, actor=actor_for(operator), reason="ref logprob fell too far")
    refresh = settled(refresh, RefreshState.HELD, RefreshState.SUCCEEDED)
    assert refresh.state == RefreshState.HELD
    assert "ref logprob fell too far" in refresh.held_reason
    assert set(fleet_versions(fleet).values()) == {"v1"}


def test_the_outcome_is_the_runs_row_alone_and_page_and_api_read_it_there(
    fleet, source, operator, admin_user
):
    """The progress names the run; the outcome, score and summary the page and the API show
    are the run's row, read when shown: correct the row and both follow, and a copy left in
    an older progress is never shown."""
    refresh = borderline(fleet, source, operator, admin_user)
    run = analysis_of(refresh)
    assert refresh.progress["canary"]["analysis"] == {"run_id": run.pk, "template": TEMPLATE}

    client = Client()
    client.force_login(operator)

    def shown() -> tuple[dict, str]:
        api = client.get(f"/api/v1/refreshes/{refresh.pk}").json()["canary"]["analysis"]
        listed = client.get("/api/v1/refreshes").json()["items"]
        assert [r["canary"]["analysis"] for r in listed if r["id"] == refresh.pk] == [api]
        return api, client.get(f"/refreshes/{refresh.pk}/").content.decode()

    api, page = shown()
    assert api == {
        "run_id": run.pk,
        "template": TEMPLATE,
        "template_version": run.template.version,
        "outcome": "marginal",
        "score": 75,
        "summary": run.summary,
    }
    assert "Canary analysis marginal (score 75.0): a person decides" in page

    CanaryAnalysis.objects.filter(pk=run.pk).update(summary="read again from the row")
    stale = {**refresh.progress["canary"]["analysis"], "outcome": "pass", "score": 99.0}
    PolicyRefresh.objects.filter(pk=refresh.pk).update(
        progress={**refresh.progress, "canary": {**refresh.progress["canary"], "analysis": stale}}
    )
    api, page = shown()
    assert (api["outcome"], api["score"], api["summary"]) == (
        "marginal",
        75,
        "read again from the row",
    )
    assert "read again from the row" in page and "Canary analysis marginal" in page
