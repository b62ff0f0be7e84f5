"""The local login form never completes a single sign-on.

The attack: someone holding an authorization code meant for another browser (from a log, a
referer, a shared screen) posts the local login form to `/accounts/login/?code=<code>&state=x`
with any name and password. Django's `authenticate()` used to fall through to the single sign-on
backend, which exchanged the code with no state, nonce or PKCE verifier and signed the caller in
as the provider's person. Now the form asks the password backend only, and the single sign-on
backend runs only for the callback view with the session's state, nonce and verifier.

The provider here does not insist on PKCE (as many do not), so a code got without a nonce or a
challenge is one the old login form did exchange and sign in with.
"""

from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from django.contrib.auth import get_user_model

from controlplane.accounts.models import SsoIdentity
from controlplane.audit.actions import AuditAction
from controlplane.audit.models import AuditEvent
from tests.conftest import PASSWORD
from tests.integration.accounts.sso_flow import (
    CLIENT_ID,
    CLIENT_SECRET,
    callback_url_with_code,
    code_from_provider,
    csrf_of,
)


@pytest.fixture(scope="module")
def provider_env() -> dict[str, str]:
    return {"IDP_PKCE_REQUIRED": "false"}


def _post_login_form(app: str, query: str, username: str, password: str) -> httpx.Client:
    attacker = httpx.Client(follow_redirects=True, timeout=30)
    login = f"{app}/accounts/login/"
    form = attacker.get(login)
    response = attacker.post(
        f"{login}?{query}",
        data={
            "csrfmiddlewaretoken": csrf_of(form.text),
            "username": username,
            "password": password,
        },
        headers={"referer": login},
    )
    assert response.status_code == 401, response.text[:2000]
    return attacker


def test_login_form_does_not_exchange_a_code_from_the_provider(
    provider, control_plane, transactional_db
):
    provider.person("wendy", "rl-admins")
    code = code_from_provider(provider, control_plane, "wendy")

    attacker = _post_login_form(control_plane, f"code={code}&state=anything", "wendy", "guess")

    assert attacker.get(f"{control_plane}/").url.path == "/accounts/login/"  # not signed in
    assert not get_user_model().objects.filter(username="wendy").exists()
    assert not AuditEvent.objects.filter(action=AuditAction.LOGIN_SUCCEEDED).exists()
    # The code is unspent: the provider still exchanges it, once, for the client it names.
    exchanged = httpx.post(
        f"{provider.url}/o/token/",
        data={
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": f"{control_plane}/accounts/sso/callback/",
            "client_id": CLIENT_ID,
            "client_secret": CLIENT_SECRET,
        },
    )
    assert exchanged.status_code == 200, exchanged.text
    assert "id_token" in exchanged.json()


def test_login_form_with_a_code_in_its_url_neither_signs_in_nor_spends_the_code(
    provider, control_plane, transactional_db
):
    provider.person("victor", "rl-admins")
    victim, callback = callback_url_with_code(control_plane, "victor")
    code = parse_qs(urlsplit(callback).query)["code"][0]

    attacker = _post_login_form(control_plane, f"code={code}&state=anything", "x", "y")

    assert attacker.get(f"{control_plane}/").url.path == "/accounts/login/"  # not signed in
    assert not SsoIdentity.objects.exists()
    assert not get_user_model().objects.filter(username="victor").exists()
    assert not AuditEvent.objects.filter(action=AuditAction.LOGIN_SUCCEEDED).exists()
    [failed] = AuditEvent.objects.filter(action=AuditAction.LOGIN_FAILED)
    assert failed.details == {"username": "x"}

    # The code was never exchanged: it still signs in the browser it was issued to, once.
    landed = victim.get(callback)
    assert landed.url.path == "/"
    assert 'class="role role-admin">admin<' in landed.text
    assert AuditEvent.objects.get(action=AuditAction.LOGIN_SUCCEEDED).details == {"via": "sso"}


def test_local_accounts_still_sign_in_with_the_form(
    provider, control_plane, admin_user, transactional_db
):
    browser = httpx.Client(follow_redirects=True, timeout=30)
    login = f"{control_plane}/accounts/login/"
    form = browser.get(login)
    landed = browser.post(
        f"{login}?code=ignored&state=ignored",
        data={
            "csrfmiddlewaretoken": csrf_of(form.text),
            "username": admin_user.username,
            "password": PASSWORD,
        },
        headers={"referer": login},
    )
    assert landed.url.path == "/" and 'class="role role-admin">admin<' in landed.text
    [ok] = AuditEvent.objects.filter(action=AuditAction.LOGIN_SUCCEEDED)
    assert ok.actor_user_id == admin_user.pk and ok.details == {}
