"""The plan preview reads top-down: summary, Confirm/Discard, blockers with fixes, per-worker
calls collapsed with JSON as JSON; plans can be discarded, and expire when never started."""

from __future__ import annotations

import re
from datetime import timedelta
from html import unescape

import pytest
from django.conf import settings
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone

from controlplane.audit.models import AuditEvent
from controlplane.refresh import intents, tasks
from controlplane.refresh.models import PolicyRefresh, RefreshState
from controlplane.refresh.plansummary import OTHER_FIX, group_blockers
from controlplane.simfleet import Fault
from tests.integration.refresh.helpers import (
    actor_for,
    fleet_config,
    make_source,
    plan,
    run_inline,
    sync_workers,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet(simfleet_factory):
    return simfleet_factory(fleet_config(3))


@pytest.fixture
def source(fleet):
    return make_source(fleet)


def page_of(client, refresh) -> str:
    response = client.get(reverse("refresh:detail", args=[refresh.pk]))
    assert response.status_code == 200
    return response.content.decode()


def text_of(page: str) -> str:
    """What a reader sees: tags dropped, entities decoded."""
    return unescape(re.sub(r"<[^>]+>", " ", page))


def test_the_summary_comes_first_with_confirm_and_discard_under_it(
    source, operator, operator_client
):
    refresh = plan(source, operator, pause_mode="keep", inflight_may_straddle=True)
    page = page_of(operator_client, refresh)
    text = text_of(page)

    assert "3 of 3 workers ready" in text
    namespaces = {w.namespace for w in refresh.workers.all()}  # each has its own line
    for namespace in namespaces:
        assert f'data-namespace="{namespace}"' in page
    assert re.search(r"Update method\s+disk \u00d7 3", text)
    families = {w.family for w in refresh.workers.all()}
    for family in families:
        assert re.search(rf"{family}: keep \(\d workers?\)", text)
    assert re.search(rf"3 workers in {len(namespaces)} namespaces? \(", text)
    assert "Expected duration  no history yet" in text
    # Confirm and Discard sit in the cockpit on top, before the summary and any per-worker call.
    confirm, discard = page.index('id="confirm-refresh"'), page.index('id="discard-refresh"')
    assert page.index('id="cockpit"') < confirm < page.index('id="plan-expected"')
    assert discard < page.index('class="grid plan-workers"')
    assert 'data-dialog="dialog-discard"' in page and "Discard plan #" in page
    # Calls are collapsed, their bodies pretty JSON (escaped), never Python reprs.
    assert '<details class="worker-calls">' in page
    assert "&quot;model_path&quot;: &quot;/ckpt/v2&quot;" in page
    assert "{'" not in text and "None" not in text and "`" not in text


def test_expected_duration_is_the_median_of_past_successful_refreshes(
    source, operator, operator_client
):
    first = plan(source, operator)
    now = timezone.now()
    for seconds in (60, 90, 600):
        PolicyRefresh.objects.filter(pk=first.pk).update(
            state=RefreshState.SUCCEEDED,
            started_at=now - timedelta(seconds=seconds),
            finished_at=now,
        )
        copy = PolicyRefresh.objects.get(pk=first.pk)
        copy.pk = None
        copy.save()
    # A failed one and another source's never count.
    PolicyRefresh.objects.filter(pk=first.pk).update(
        state=RefreshState.FAILED, started_at=now - timedelta(hours=5)
    )
    refresh = plan(source, operator, version="v3")
    text = text_of(page_of(operator_client, refresh))
    assert "about 1 min 30 s (median of 3 successful refreshes, 1 min to 10 min)" in text


def test_blockers_are_grouped_with_their_fix_and_confirm_is_gone(
    fleet, source, operator, operator_client
):
    key = fleet.workers()[0]["key"]
    descriptor = fleet.call(lambda: fleet.fleet.get(key).descriptor())
    descriptor["routes"] = [r for r in descriptor["routes"] if r != "update_weights_from_disk"]
    sync_workers(source)
    fleet.inject(key, "probe", Fault.reply(descriptor, once=True))
    refresh = intents.plan_policy_refresh(
        source=source,
        actor=actor_for(operator),
        target={"weight_version": "v2", "method": "disk", "model_path": "/ckpt/v2"},
    )
    page = page_of(operator_client, refresh)
    text = text_of(page)

    assert "2 of 3 workers ready" in text and "1 blocked" in text
    blockers = page[page.index('id="plan-blockers"') :]
    assert 'data-kind="missing route"' in blockers
    assert "needs update_weights_from_disk, which the worker does not advertise" in text
    assert "Fix: The worker must advertise this admin route: check its Dynamo version" in text
    assert key in unescape(blockers)
    assert 'id="confirm-refresh"' not in page and 'id="discard-refresh"' in page


def test_discard_needs_permission_is_audited_and_is_not_listed_as_completed(
    source, operator, viewer_client, operator_client
):
    refresh = plan(source, operator)
    url = reverse("refresh:discard", args=[refresh.pk])
    assert operator_client.get(url).status_code == 405
    assert viewer_client.post(url).status_code == 403
    refresh.refresh_from_db()
    assert refresh.state == RefreshState.PLANNED
    planned = viewer_client.get(reverse("refresh:list") + "?state=planned").content.decode()
    assert planned.count(f"#{refresh.pk}<")

    response = operator_client.post(url)
    assert response.status_code == 302
    refresh.refresh_from_db()
    assert refresh.state == RefreshState.ABORTED and refresh.started_at is None
    event = AuditEvent.objects.get(action="policy_refresh.discarded", target_id=str(refresh.pk))
    assert event.actor_user_id == operator.pk

    listed = reverse("refresh:list")
    succeeded = operator_client.get(listed + "?state=succeeded").content.decode()
    assert f"#{refresh.pk}<" not in succeeded
    discarded = operator_client.get(listed + "?state=discarded").content.decode()
    assert f"#{refresh.pk}<" in discarded and 'class="badge discarded">discarded<' in discarded
    # A second discard changes nothing and says why.
    again = operator_client.post(url, follow=True).content.decode()
    assert "only a planned refresh" in unescape(again)
    assert AuditEvent.objects.filter(action="policy_refresh.discarded").count() == 1


@override_settings(PLAN_EXPIRY_SECONDS=3600)
def test_plans_older_than_the_expiry_are_discarded_by_the_system(source, operator):
    old = plan(source, operator)
    fresh = plan(source, operator, version="v3")
    PolicyRefresh.objects.filter(pk=old.pk).update(
        created_at=timezone.now() - timedelta(seconds=3601)
    )
    assert tasks.expire_stale_plans.apply().get() == [old.pk]
    old.refresh_from_db()
    fresh.refresh_from_db()
    assert old.state == RefreshState.ABORTED and "expired" in old.end_reason
    assert fresh.state == RefreshState.PLANNED
    event = AuditEvent.objects.get(action="policy_refresh.discarded", target_id=str(old.pk))
    assert event.actor_type == "system" and event.actor_label == "system"
    assert tasks.expire_stale_plans.apply().get() == []  # nothing left to expire


def test_plan_expiry_is_on_the_beat_schedule():
    entry = settings.CELERY_BEAT_SCHEDULE["policy-refresh-plan-expiry"]
    assert entry["task"] == tasks.expire_stale_plans.name
    assert settings.PLAN_EXPIRY_SECONDS == 24 * 3600


def test_each_kind_of_blocker_gets_its_own_fix():
    groups = group_blockers(
        ["the generation check needs the source's frontend URL"],
        [
            ("w1", ["pause: missing route pause_generation", "probe error: timeout"]),
            ("w2", ["pause: missing route pause_generation"]),
            ("w3", ["something new"]),
        ],
    )
    by_kind = {g.kind: g for g in groups}
    assert [g.kind for g in groups] == ["missing route", "probe error", "verification", "other"]
    assert by_kind["missing route"].workers == ["w1", "w2"]
    assert by_kind["missing route"].messages == ["pause: missing route pause_generation"]
    assert "Dynamo version" in by_kind["missing route"].fix
    assert by_kind["verification"].workers == []  # a plan-level blocker names no worker
    assert by_kind["other"].fix == OTHER_FIX


def test_no_python_reprs_or_backticks_on_a_finished_refresh(source, operator, operator_client):
    refresh = run_inline(source, operator, pause_mode="keep", inflight_may_straddle=True)
    assert refresh.state == RefreshState.SUCCEEDED
    for url in (
        reverse("refresh:detail", args=[refresh.pk]),
        reverse("refresh:list"),
        reverse("refresh:gates"),
    ):
        text = text_of(operator_client.get(url).content.decode())
        assert "{'" not in text and "None" not in text and "`" not in text, url
    page = operator_client.get(reverse("refresh:detail", args=[refresh.pk])).content.decode()
    assert "&quot;mode&quot;: &quot;keep&quot;" in page  # the pause body, as JSON
