"""The local login form never completes a single sign-on.

The attack: someone holding an authorization code meant for another browser (from a log, a
referer, a shared screen) posts the local login form to `/accounts/login/?code=<code>&state=x`
with any name and password. Django's `authenticate()` used to fall through to the single sign-on
backend, which exchanged the code with no state, nonce or PKCE verifier and signed the caller in
as the provider's person. Now the form asks the password backend only, and the single sign-on
backend runs only for the callback view with the session's state, nonce and verifier.
"""

from urllib.parse import parse_qs, urlsplit

import httpx
from django.contrib.auth import get_user_model

from controlplane.accounts.models import SsoIdentity
from controlplane.audit.actions import AuditAction
from controlplane.audit.models import AuditEvent
from tests.conftest import PASSWORD
from tests.integration.accounts.sso_flow import callback_url_with_code, csrf_of


def test_login_form_with_a_code_in_its_url_neither_signs_in_nor_spends_the_code(
    provider, control_plane, transactional_db
):
    provider.person("victor", "rl-admins")
    victim, callback = callback_url_with_code(control_plane, "victor")
    code = parse_qs(urlsplit(callback).query)["code"][0]

    attacker = httpx.Client(follow_redirects=True, timeout=30)
    login = f"{control_plane}/accounts/login/"
    form = attacker.get(login)
    response = attacker.post(
        f"{login}?code={code}&state=anything",
        data={"csrfmiddlewaretoken": csrf_of(form.text), "username": "x", "password": "y"},
        headers={"referer": login},
    )

    assert response.status_code == 401
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
