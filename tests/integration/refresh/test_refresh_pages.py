"""Refresh pages: plan → preview → confirm, permissions enforced server-side, audit."""

from __future__ import annotations

import pytest
from django.urls import reverse

from controlplane.audit.models import AuditEvent
from controlplane.refresh.executor import execute_refresh
from controlplane.refresh.models import Gate, GateState, PolicyRefresh, RefreshState
from tests.integration.refresh.helpers import fleet_config, make_source, sync_workers

pytestmark = pytest.mark.django_db


@pytest.fixture
def source(simfleet_factory):
    source = make_source(simfleet_factory(fleet_config(3)))
    sync_workers(source)
    return source


def plan_form(source, version="v2"):
    return {
        "source": source.name,
        "weight_version": version,
        "method": "disk",
        "model_path": f"/ckpt/{version}",
        "pause_mode": "keep",
        "inflight_may_straddle": "on",
        "flush_policy": "auto",
        "version_readback": "on",
        "liveness": "on",
        "generation": "on",
        "prompt_token_ids": "5, 6, 7, 8",
        "max_tokens": "4",
    }


def test_plan_preview_confirm_and_live_page(source, operator_client):
    response = operator_client.post(reverse("refresh:plan"), plan_form(source))
    refresh = PolicyRefresh.objects.get()
    assert response.status_code == 302 and response.url == reverse(
        "refresh:detail", args=[refresh.pk]
    )

    preview = operator_client.get(response.url).content.decode()
    assert "engine/update_weights_from_disk" in preview and "/ckpt/v2" in preview
    assert "already invalidates the prefix cache" in preview
    assert 'id="confirm-refresh"' in preview

    operator_client.post(reverse("refresh:start", args=[refresh.pk]))
    refresh.refresh_from_db()
    assert refresh.state == RefreshState.GATING
    execute_refresh(refresh.pk)

    page = operator_client.get(reverse("refresh:detail", args=[refresh.pk])).content.decode()
    assert 'data-state="succeeded"' in page
    assert page.count('class="cell ok"') == 3 * 4  # pause, update, resume, verify
    assert f'ws-connect="/ws/refreshes/{refresh.pk}/?seen_state=succeeded&amp;seen_journal=' in page
    listing = operator_client.get(reverse("refresh:list")).content.decode()
    assert f"#{refresh.pk}" in listing
    assert {g.verified_version for g in Gate.objects.all()} == {"v2"}


def test_viewer_cannot_plan_start_or_force_reopen(source, viewer_client, operator_client):
    assert viewer_client.get(reverse("refresh:plan")).status_code == 403
    assert viewer_client.post(reverse("refresh:plan"), plan_form(source)).status_code == 403
    operator_client.post(reverse("refresh:plan"), plan_form(source))
    refresh = PolicyRefresh.objects.get()
    assert viewer_client.post(reverse("refresh:start", args=[refresh.pk])).status_code == 403
    refresh.refresh_from_db()
    assert refresh.state == RefreshState.PLANNED
    gate = Gate.objects.create(source=source, namespace="rl-a", state=GateState.CLOSED)
    forced = operator_client.post(reverse("refresh:force_reopen", args=[gate.pk]), {"reason": "x"})
    assert forced.status_code == 403
    gate.refresh_from_db()
    assert not gate.is_open


def test_force_reopen_from_the_gate_page_needs_a_reason_and_is_audited(source, approver_client):
    gate = Gate.objects.create(source=source, namespace="rl-a", state=GateState.CLOSED, reason="x")
    url = reverse("refresh:force_reopen", args=[gate.pk])
    approver_client.post(url, {"reason": ""})
    gate.refresh_from_db()
    assert not gate.is_open
    approver_client.post(url, {"reason": "manual verification done"})
    gate.refresh_from_db()
    assert gate.is_open
    event = AuditEvent.objects.get(action="gate.force_reopened")
    assert event.details["reason"] == "manual verification done"
    assert event.actor_label == "approver-1"


def test_approval_by_another_user(source, operator, operator_client, approver_client):
    source.require_approval = True
    source.save()
    operator_client.post(reverse("refresh:plan"), plan_form(source))
    refresh = PolicyRefresh.objects.get()
    operator_client.post(reverse("refresh:start", args=[refresh.pk]))
    refresh.refresh_from_db()
    assert refresh.state == RefreshState.AWAITING_APPROVAL
    # The operator lacks the approve permission; the approver is another person.
    assert operator_client.post(reverse("refresh:approve", args=[refresh.pk])).status_code == 403
    approver_client.post(reverse("refresh:approve", args=[refresh.pk]))
    refresh.refresh_from_db()
    assert refresh.state == RefreshState.GATING
    assert refresh.approved_by.get_username() == "approver-1"


def test_live_fragments_fetch_the_action_buttons_for_the_viewing_user(source, operator, viewer):
    """The stream has no request (no permissions, no CSRF token), so its fragment loads the
    buttons over HTTP; what comes back depends on who asks."""
    from django.template.loader import render_to_string
    from django.test import Client

    from controlplane.refresh import presenters
    from tests.integration.refresh.helpers import plan

    refresh = plan(source, operator)
    PolicyRefresh.objects.filter(pk=refresh.pk).update(state=RefreshState.HELD)
    refresh.refresh_from_db()

    pushed = render_to_string(
        "refresh/detail.html#live", presenters.detail_context(refresh) | {"oob": True}
    )
    actions_url = f"/refreshes/{refresh.pk}/actions/"
    assert f'hx-get="{actions_url}"' in pushed and "Retry" not in pushed

    as_operator = Client()
    as_operator.force_login(operator)
    buttons = as_operator.get(actions_url).content.decode()
    assert "Retry" in buttons and "Roll back" in buttons
    assert 'name="csrfmiddlewaretoken"' in buttons

    as_viewer = Client()
    as_viewer.force_login(viewer)
    assert "Retry" not in as_viewer.get(actions_url).content.decode()
