"""The approval inbox page: what awaits *my* approval, by the approve rule (the permission,
and not the requester: four eyes), with approve and reject forms that run the real actions."""

from __future__ import annotations

import pytest
from django.urls import reverse

from controlplane.accounts.roles import Role
from controlplane.accounts.services import create_user_with_role
from controlplane.refresh.inbox import awaiting_approval_by
from controlplane.refresh.models import PolicyRefresh, RefreshState
from tests.conftest import PASSWORD
from tests.integration.refresh.test_refresh_list_page import _refresh, _source

pytestmark = pytest.mark.django_db

INBOX = "/refreshes/inbox/"


def test_inbox_url():
    assert reverse("refresh:inbox") == INBOX


def test_viewer_and_operator_have_no_inbox(viewer_client, operator_client):
    assert viewer_client.get(INBOX).status_code == 403
    assert operator_client.get(INBOX).status_code == 403
    # Nor the link in the top bar.
    assert "inbox-badge" not in operator_client.get(reverse("refresh:list")).content.decode()


def test_approver_sees_what_others_asked_for_not_their_own(client, approver, operator):
    sim = _source("sim")
    theirs = _refresh(sim, RefreshState.AWAITING_APPROVAL, by=operator)
    by_webhook = _refresh(sim, RefreshState.AWAITING_APPROVAL, label="webhook:trainer")
    own = _refresh(sim, RefreshState.AWAITING_APPROVAL, by=approver)
    running = _refresh(sim, RefreshState.UPDATING, by=operator)
    client.login(username=approver.username, password=PASSWORD)
    html = client.get(INBOX).content.decode()
    assert f'id="inbox-{theirs.pk}"' in html and f'id="inbox-{by_webhook.pk}"' in html
    assert f'id="inbox-{own.pk}"' not in html and f'id="inbox-{running.pk}"' not in html
    assert html.index(f'id="inbox-{theirs.pk}"') < html.index(f'id="inbox-{by_webhook.pk}"')
    assert f'action="{reverse("refresh:approve", args=[theirs.pk])}"' in html
    assert f'action="{reverse("refresh:reject", args=[theirs.pk])}"' in html
    # The top bar links the inbox (its count comes over ws/inbox/).
    assert f'href="{INBOX}"' in html and 'id="inbox-badge"' in html
    assert set(awaiting_approval_by(approver).values_list("pk", flat=True)) == {
        theirs.pk,
        by_webhook.pk,
    }


def test_an_empty_inbox_says_so(approver_client):
    assert "Nothing awaits your approval." in approver_client.get(INBOX).content.decode()


def test_rejecting_from_the_inbox_runs_the_action(client, operator):
    admin = create_user_with_role("admin-2", Role.ADMIN, PASSWORD, validate=False)
    waiting = _refresh(_source("sim"), RefreshState.AWAITING_APPROVAL, by=operator)
    client.login(username=admin.username, password=PASSWORD)
    assert f'id="inbox-{waiting.pk}"' in client.get(INBOX).content.decode()
    client.post(reverse("refresh:reject", args=[waiting.pk]), {"reason": "wrong checkpoint"})
    waiting.refresh_from_db()
    assert waiting.state == RefreshState.REJECTED
    assert "Nothing awaits your approval." in client.get(INBOX).content.decode()


def test_the_inbox_is_get_only(approver_client):
    assert approver_client.post(INBOX).status_code == 405
    assert PolicyRefresh.objects.count() == 0
