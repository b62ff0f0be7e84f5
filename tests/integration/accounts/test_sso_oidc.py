"""Single sign-on end to end: a real OpenID provider (django-oauth-toolkit, its own process) and
the control plane (Daphne, its own process), driven through the authorization-code flow by an
HTTP client that follows the redirects a browser would.

Roles come from the provider's groups at every sign-in: a person moved to another group gets the
new role and loses the old one; left with no mapped group they lose their role and are refused.
"""

import httpx
import pytest
from django.contrib.auth import get_user_model

from controlplane.accounts.models import SsoIdentity
from controlplane.accounts.roles import Role, role_of
from controlplane.audit.actions import AuditAction
from controlplane.audit.models import AuditEvent
from tests.conftest import PASSWORD
from tests.integration.accounts.sso_flow import (
    IDP_PASSWORD,
    PROVIDER,
    csrf_of,
    events_for,
    sign_in_with_sso,
)


def test_group_change_between_sign_ins_changes_the_role(provider, control_plane, transactional_db):
    provider.person("alice", "rl-viewers", "unrelated-group")

    browser, landed = sign_in_with_sso(control_plane, "alice")
    assert landed.status_code == 200
    assert landed.url.host == "127.0.0.1" and landed.url.path == "/"
    assert 'class="role role-viewer">viewer<' in landed.text
    # The session is bounded (OIDC_SESSION_SECONDS, 8 hours by default): then groups are reread.
    callback = [r for r in landed.history if r.url.path == "/accounts/sso/callback/"]
    assert "Max-Age=28800" in callback[0].headers["set-cookie"]
    alice = get_user_model().objects.get(username="alice")
    assert role_of(alice) == Role.VIEWER
    assert not alice.has_usable_password()
    identity = SsoIdentity.objects.get(user=alice)
    assert identity.issuer == provider.issuer
    created = events_for(AuditAction.USER_CREATED, "alice")
    assert [e.details for e in created] == [{"username": "alice", "role": "viewer", "via": "sso"}]
    [login] = events_for(AuditAction.LOGIN_SUCCEEDED, "alice")
    assert login.details == {"via": "sso"} and login.actor_user_id == alice.pk
    # Signed in: the login page sends them on.
    assert browser.get(f"{control_plane}/accounts/login/").url.path == "/"

    # Sign out (audited like a local sign-out), moved to operators at the provider, sign in.
    page = browser.get(f"{control_plane}/")
    browser.post(
        f"{control_plane}/accounts/logout/",
        data={"csrfmiddlewaretoken": csrf_of(page.text)},
        headers={"referer": f"{control_plane}/"},
    )
    assert events_for(AuditAction.LOGGED_OUT, "alice")
    provider.person("alice", "rl-operators")
    _, landed = sign_in_with_sso(control_plane, "alice")
    assert 'class="role role-operator">operator<' in landed.text
    alice.refresh_from_db()
    assert set(alice.groups.values_list("name", flat=True)) == {"operator"}
    [changed] = events_for(AuditAction.USER_ROLE_CHANGED, "alice")
    assert changed.details == {"username": "alice", "role": "operator", "via": "sso"}
    assert changed.actor_label == "single sign-on"
    assert get_user_model().objects.filter(username="alice").count() == 1

    # Same groups again: nothing to change, nothing audited.
    sign_in_with_sso(control_plane, "alice")
    assert len(events_for(AuditAction.USER_ROLE_CHANGED, "alice")) == 1

    # Out of every mapped group: the role goes and the sign-in is refused, with the reason.
    provider.person("alice", "unrelated-group")
    _, landed = sign_in_with_sso(control_plane, "alice")
    assert landed.url.path == "/accounts/login/"
    assert "none of your groups is given a role here any more" in landed.text
    assert 'class="role ' not in landed.text
    alice.refresh_from_db()
    assert role_of(alice) is None
    assert events_for(AuditAction.USER_ROLE_CHANGED, "alice")[-1].details["role"] is None
    failed = events_for(AuditAction.LOGIN_FAILED, "alice")[-1]
    assert failed.details["via"] == "sso"
    assert failed.details["reason"] == "none of your groups is given a role here any more"


def test_unmapped_person_is_refused_and_nothing_is_created(
    provider, control_plane, transactional_db
):
    provider.person("mallory", "contractors")
    _, landed = sign_in_with_sso(control_plane, "mallory")
    assert landed.url.path == "/accounts/login/"
    assert "none of your groups is given a role here" in landed.text
    assert not get_user_model().objects.filter(username="mallory").exists()


def test_provider_cannot_take_over_a_local_account(
    provider, control_plane, admin_user, transactional_db
):
    """A provider person named like the local break-glass admin is refused, not linked; the
    local admin still signs in with their password on the same server."""
    provider.person(admin_user.username, "rl-admins")
    _, landed = sign_in_with_sso(control_plane, admin_user.username)
    assert landed.url.path == "/accounts/login/"
    assert "is already taken here" in landed.text
    assert not SsoIdentity.objects.filter(user=admin_user).exists()

    local = httpx.Client(follow_redirects=True, timeout=30)
    form = local.get(f"{control_plane}/accounts/login/")
    landed = local.post(
        f"{control_plane}/accounts/login/",
        data={
            "csrfmiddlewaretoken": csrf_of(form.text),
            "username": admin_user.username,
            "password": PASSWORD,
        },
        headers={"referer": f"{control_plane}/accounts/login/"},
    )
    assert landed.url.path == "/" and 'class="role role-admin">admin<' in landed.text


def test_forged_callback_is_refused_and_audited(control_plane, transactional_db):
    browser = httpx.Client(follow_redirects=True, timeout=30)
    landed = browser.get(f"{control_plane}/accounts/sso/callback/?code=made-up&state=made-up")
    assert landed.url.path == "/accounts/login/"
    assert "Single sign-on did not let you in" in landed.text
    assert AuditEvent.objects.filter(action=AuditAction.LOGIN_FAILED, details__via="sso").exists()


@pytest.mark.browser
def test_sso_sign_in_in_chromium(provider, control_plane, _browser, transactional_db):
    """The same flow in a real browser: the button, the provider's form, back signed in (the
    session cookie survives the cross-site redirect chain back to the callback)."""
    provider.person("bob", "rl-operators")
    context = _browser.new_context(base_url=control_plane)
    context.set_default_timeout(15_000)
    page = context.new_page()
    try:
        page.goto("/accounts/login/")
        page.click(f"text=Sign in with {PROVIDER}")
        page.wait_for_url(lambda url: url.startswith(provider.url))
        page.fill("#id_username", "bob")
        page.fill("#id_password", IDP_PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_url(f"{control_plane}/")
        assert page.locator(".whoami .role").inner_text() == "operator"
    finally:
        context.close()
