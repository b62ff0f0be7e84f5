"""An analysis whose template is gone by the time it runs: no run row can be made (a run
names its template), so the refresh's own reference is the outcome's only record, and the
page and the API show it from there."""

from __future__ import annotations

import pytest
from django.test import Client

from controlplane.analysis.models import AnalysisTemplate
from controlplane.refresh.intents.analysis import run_canary_analysis
from controlplane.refresh.models import CanaryAnalysis, RefreshState
from tests.integration.canary_analysis.helpers import (
    TEMPLATE,
    canary,
    lineage_fleet_config,
    save,
)
from tests.integration.refresh.helpers import make_source, run_inline

pytestmark = pytest.mark.django_db


def test_an_analysis_without_its_template_holds_for_a_person_and_says_why(
    simfleet_factory, operator, admin_user
):
    source = make_source(simfleet_factory(lineage_fleet_config(6)))
    assert run_inline(source, operator, "v1").state == RefreshState.SUCCEEDED
    save(source, admin_user)
    refresh = run_inline(source, operator, "v2", strategy=canary())
    assert refresh.state == RefreshState.CANARY_REVIEW, refresh.held_reason
    AnalysisTemplate.objects.filter(source=source, name=TEMPLATE).delete()

    run_canary_analysis(refresh.pk)
    refresh.refresh_from_db()
    assert not CanaryAnalysis.objects.filter(refresh=refresh).exists()
    stored = refresh.progress["canary"]
    assert stored["needs_person"] and stored["analysis"]["outcome"] == "inconclusive"

    client = Client()
    client.force_login(operator)
    shown = client.get(f"/api/v1/refreshes/{refresh.pk}").json()["canary"]["analysis"]
    assert shown["template"] == TEMPLATE and shown["outcome"] == "inconclusive"
    assert shown["summary"] == stored["analysis"]["summary"] and TEMPLATE in shown["summary"]
    page = client.get(f"/refreshes/{refresh.pk}/").content.decode()
    assert "Canary analysis inconclusive: a person decides" in page
