"""An API token of a single sign-on user carries the role it was minted with, and no more.

The finding: an admin removed from every group at the provider still created a source with her
token after her session had ended. A token acting as a single sign-on user now keeps the role
the user had at minting (it never acts above it, whatever the user is given later), expires at
most `OIDC_SESSION_SECONDS` after minting (when the session it came from would have), and a
later sign-in that maps to a role that cannot do what the token's role can, or a sign-in refused
for want of a mapped group, revokes it at once (audited, with the reason).
"""

import re
import time
from datetime import timedelta

import httpx
import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.utils import timezone

from controlplane.accounts import tokens
from controlplane.accounts.models import ApiToken, SsoIdentity
from controlplane.accounts.roles import Role
from controlplane.audit.actions import AuditAction
from controlplane.audit.models import AuditEvent
from controlplane.audit.recorder import Actor
from tests.integration.accounts.sso_flow import csrf_of, sign_in_with_sso

#: OIDC_SESSION_SECONDS of the live control plane (its default).
SESSION_SECONDS = 8 * 3600
SECRET = re.compile(r"cpt_[0-9a-f]{12}_[A-Za-z0-9_-]{43}")


def _new_source(app: str, secret: str, name: str) -> httpx.Response:
    body = {
        "name": name,
        "listener_url": "http://127.0.0.1:1/",
        "allowed_networks": ["127.0.0.0/8"],
    }
    return httpx.post(
        f"{app}/api/v1/sources", json=body, headers={"Authorization": f"Bearer {secret}"}
    )


def _mint_on_the_tokens_page(browser: httpx.Client, app: str, user, label: str) -> str:
    form = browser.get(f"{app}/admin-tools/tokens/new/")
    created = browser.post(
        f"{app}/admin-tools/tokens/new/",
        data={
            "csrfmiddlewaretoken": csrf_of(form.text),
            "label": label,
            "user": str(user.pk),
            "expires_days": "",  # asked for: never
        },
        headers={"referer": f"{app}/admin-tools/tokens/new/"},
    )
    assert created.status_code == 200, created.text[:2000]
    match = SECRET.search(created.text)
    assert match, created.text[:2000]
    return match.group(0)


def test_an_sso_admins_token_ends_with_her_session_and_goes_when_she_is_demoted(
    provider, control_plane, transactional_db
):
    provider.person("dana", "rl-admins")
    browser, landed = sign_in_with_sso(control_plane, "dana")
    assert 'class="role role-admin">admin<' in landed.text
    dana = get_user_model().objects.get(username="dana")

    before = timezone.now()
    secret = _mint_on_the_tokens_page(browser, control_plane, dana, "dana-bot")
    token = ApiToken.objects.get(label="dana-bot")
    assert token.role == Role.ADMIN
    # Asked for no expiry; given one session's length at most.
    assert token.expires_at is not None
    assert before < token.expires_at <= timezone.now() + timedelta(seconds=SESSION_SECONDS)
    created = AuditEvent.objects.get(action=AuditAction.TOKEN_CREATED)
    assert created.details["role"] == "admin"
    assert created.details["expires_at"] == token.expires_at.isoformat()
    assert _new_source(control_plane, secret, "while-admin").status_code == 201

    # Moved to operators at the provider; at her next sign-in the admin token goes.
    provider.person("dana", "rl-operators")
    _, landed = sign_in_with_sso(control_plane, "dana")
    assert 'class="role role-operator">operator<' in landed.text
    token.refresh_from_db()
    assert token.revoked_at is not None
    revoked = AuditEvent.objects.get(action=AuditAction.TOKEN_REVOKED)
    assert revoked.actor_label == "single sign-on"
    assert revoked.details["reason"] == "single sign-on now gives dana operator"
    assert _new_source(control_plane, secret, "after-demotion").status_code == 401


def test_a_token_never_acts_above_its_minting_role_and_goes_when_sign_in_is_refused(
    provider, control_plane, admin_user, transactional_db
):
    provider.person("omar", "rl-operators")
    sign_in_with_sso(control_plane, "omar")
    omar = get_user_model().objects.get(username="omar")
    _, secret = tokens.create_token(user=omar, label="omar-bot", actor=Actor.for_user(admin_user))
    assert ApiToken.objects.get(label="omar-bot").role == Role.OPERATOR

    # Promoted at the provider: his session is admin, the token minted as operator is not.
    provider.person("omar", "rl-admins")
    _, landed = sign_in_with_sso(control_plane, "omar")
    assert 'class="role role-admin">admin<' in landed.text
    assert _new_source(control_plane, secret, "by-operator-token").status_code == 403
    auth = {"Authorization": f"Bearer {secret}"}
    assert httpx.get(f"{control_plane}/api/v1/sources", headers=auth).status_code == 200
    assert not ApiToken.objects.get(label="omar-bot").revoked_at  # promotion keeps it

    # Left with no mapped group: the sign-in is refused and the token goes with the role.
    provider.person("omar", "contractors")
    _, landed = sign_in_with_sso(control_plane, "omar")
    assert landed.url.path == "/accounts/login/"
    assert httpx.get(f"{control_plane}/api/v1/sources", headers=auth).status_code == 401
    revoked = AuditEvent.objects.get(action=AuditAction.TOKEN_REVOKED)
    assert revoked.details["reason"] == "single sign-on now gives omar no role"


def _sso_user(name: str, role: Role | None):
    user = get_user_model().objects.create_user(username=name)
    SsoIdentity.objects.create(user=user, issuer="https://idp.test", subject=name)
    user.groups.set([Group.objects.get(name=role.value)] if role else [])
    return user


def test_an_sso_users_token_stops_working_when_the_session_would_end(db, settings):
    settings.SSO_SESSION_SECONDS = 2
    user = _sso_user("erin", Role.ADMIN)
    _, secret = tokens.create_token(user=user, label="erin", actor=Actor.system(), expires_days=30)
    minted = time.monotonic()
    grant = tokens.grant_for(secret)
    assert grant is not None and grant.allows("accounts.manage_sources")

    deadline = minted + 10
    while tokens.grant_for(secret) is not None:
        assert time.monotonic() < deadline, "the token outlived the session length"
        time.sleep(0.1)
    assert time.monotonic() - minted >= 1  # it lived, then lapsed: not refused from the start


def test_local_users_tokens_are_not_bounded_and_a_roleless_sso_user_gets_none(db, operator):
    local, _ = tokens.create_token(
        user=operator, label="ops", actor=Actor.system(), expires_days=30
    )
    assert local.role == "" and local.expires_at > timezone.now() + timedelta(days=29)

    roleless = _sso_user("nobody", None)
    with pytest.raises(ValidationError, match="has no role to give a token"):
        tokens.create_token(user=roleless, label="nobody", actor=Actor.system())
    assert not ApiToken.objects.filter(label="nobody").exists()
