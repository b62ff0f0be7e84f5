"""A canary analysis that could not judge anything is refused at plan time, with a clear
error, before anything moves: a template with too few prompts, a template that does not exist,
and a cohort with no baseline workers (everything outside the canary already on the target)."""

from __future__ import annotations

import pytest

from controlplane.analysis.models import AnalysisTemplate
from controlplane.refresh.models import RefreshState
from tests.integration.canary_analysis.helpers import (
    TEMPLATE,
    canary,
    lineage_fleet_config,
    prompts,
    save,
)
from tests.integration.refresh.helpers import make_source, plan, run_inline

pytestmark = pytest.mark.django_db


@pytest.fixture
def source(simfleet_factory, operator):
    source = make_source(simfleet_factory(lineage_fleet_config(6)))
    assert run_inline(source, operator, "v1").state == RefreshState.SUCCEEDED
    return source


def test_a_template_with_too_few_prompts_is_refused_at_plan_time(source, operator):
    # Saving refuses such a template (spec.py); one stored before its rule tightened is the
    # case the plan must still catch.
    AnalysisTemplate.objects.create(
        source=source, name=TEMPLATE, version=1, body={"prompts": prompts(5)}
    )
    refresh = plan(source, operator, "v2", strategy=canary())
    assert refresh.state == RefreshState.PLANNED
    text = " ".join(refresh.plan_blockers)
    assert "canary analysis" in text and TEMPLATE in text, refresh.plan_blockers
    assert "20" in text  # the template's min_prompts, named


def test_a_missing_template_is_refused_at_plan_time(source, operator):
    refresh = plan(source, operator, "v2", strategy=canary())
    assert any(f"no template '{TEMPLATE}'" in b for b in refresh.plan_blockers), (
        refresh.plan_blockers
    )


def test_no_baseline_workers_is_refused_at_plan_time(source, operator, admin_user):
    save(source, admin_user)
    assert run_inline(source, operator, "v2").state == RefreshState.SUCCEEDED
    # Everything already serves v2: a canary to v2 would be compared with nothing.
    refresh = plan(source, operator, "v2", strategy=canary())
    assert any("no baseline workers" in b for b in refresh.plan_blockers), refresh.plan_blockers
    # With a baseline present the same template plans cleanly.
    assert not plan(source, operator, "v3", strategy=canary()).plan_blockers
