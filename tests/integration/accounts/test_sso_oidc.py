"""Single sign-on end to end: a real OpenID provider (django-oauth-toolkit, its own process) and
the control plane (Daphne, its own process), driven through the authorization-code flow by an
HTTP client that follows the redirects a browser would.

Roles come from the provider's groups at every sign-in: a person moved to another group gets the
new role and loses the old one; left with no mapped group they lose their role and are refused.
"""

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from django.contrib.auth import get_user_model

from controlplane.accounts.models import SsoIdentity
from controlplane.accounts.roles import Role, role_of
from controlplane.audit.actions import AuditAction
from controlplane.audit.models import AuditEvent
from controlplane.embedded.redis import free_port
from tests.conftest import PASSWORD
from tests.fixtures.live_server import ROOT, asgi_server

CLIENT_ID = "controlplane"
CLIENT_SECRET = "s" * 40
IDP_PASSWORD = "idp-password-123"
PROVIDER = "Test IdP"


class Provider:
    def __init__(self, url: str, env: dict[str, str]) -> None:
        self.url = url
        self.issuer = f"{url}/o"
        self.env = env

    def manage(self, *args: str) -> str:
        result = subprocess.run(
            [sys.executable, "-m", "django", *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            check=True,
        )
        return result.stdout.strip()

    def person(self, username: str, *groups: str) -> None:
        self.manage("idp_user", username, IDP_PASSWORD, "--groups", ",".join(groups))


@pytest.fixture(scope="module")
def provider(tmp_path_factory) -> Iterator[Provider]:
    workdir = tmp_path_factory.mktemp("idp")
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    port = free_port()
    # `localhost`, not 127.0.0.1: cookies ignore ports, and the control plane is on 127.0.0.1.
    url = f"http://localhost:{port}"
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "DATABASE_", "OIDC"))
    }
    env.update(
        DJANGO_SETTINGS_MODULE="tests.sso_idp.settings",
        IDP_DB=str(workdir / "idp.sqlite3"),
        IDP_RSA_PRIVATE_KEY=pem,
        IDP_ISSUER=f"{url}/o",
        PYTHONPATH=str(ROOT),
    )
    idp = Provider(url, env)
    idp.manage("migrate", "--noinput", "-v", "0")
    log = open(workdir / "idp.log", "wb")  # noqa: SIM115 (kept open for the server's life)
    process = subprocess.Popen(
        [sys.executable, "-m", "django", "runserver", f"127.0.0.1:{port}", "--noreload"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            httpx.get(f"http://127.0.0.1:{port}/o/.well-known/openid-configuration", timeout=2)
            break
        except httpx.TransportError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError((workdir / "idp.log").read_text()) from None
            time.sleep(0.2)
    try:
        yield idp
    finally:
        process.terminate()
        process.wait(10)
        log.close()


@pytest.fixture(scope="module")
def control_plane(provider, django_db_setup, tmp_path_factory) -> Iterator[str]:
    """The control plane with single sign-on configured from the provider's discovery document,
    as an operator would configure it."""
    config = httpx.get(f"{provider.url}/o/.well-known/openid-configuration").json()
    assert config["issuer"] == provider.issuer
    log_path = tmp_path_factory.mktemp("sso-live") / "daphne.log"
    with asgi_server(
        log_path,
        OIDC_PROVIDER_NAME=PROVIDER,
        OIDC_RP_CLIENT_ID=CLIENT_ID,
        OIDC_RP_CLIENT_SECRET=CLIENT_SECRET,
        OIDC_OP_ISSUER=config["issuer"],
        OIDC_OP_AUTHORIZATION_ENDPOINT=config["authorization_endpoint"],
        OIDC_OP_TOKEN_ENDPOINT=config["token_endpoint"],
        OIDC_OP_USER_ENDPOINT=config["userinfo_endpoint"],
        OIDC_OP_JWKS_ENDPOINT=config["jwks_uri"],
        OIDC_ROLE_MAP="rl-viewers=viewer,rl-operators=operator,rl-admins=admin",
    ) as url:
        provider.manage("idp_client", CLIENT_ID, CLIENT_SECRET, f"{url}/accounts/sso/callback/")
        yield url


def _csrf(html: str) -> str:
    match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html)
    assert match, html
    return match.group(1)


def sign_in_with_sso(app: str, username: str) -> tuple[httpx.Client, httpx.Response]:
    """A fresh browser: the control plane's button, the provider's login form, back again."""
    browser = httpx.Client(follow_redirects=True, timeout=30)
    login_page = browser.get(f"{app}/accounts/login/")
    assert f"Sign in with {PROVIDER}" in login_page.text
    at_provider = browser.get(f"{app}/accounts/sso/login/")
    assert at_provider.url.host == "localhost", at_provider.url
    assert "/accounts/login/" in at_provider.url.path
    landed = browser.post(
        str(at_provider.url),
        data={
            "csrfmiddlewaretoken": _csrf(at_provider.text),
            "username": username,
            "password": IDP_PASSWORD,
            "next": at_provider.url.params["next"],
        },
        headers={"referer": str(at_provider.url)},
    )
    return browser, landed


def _events(action: AuditAction, username: str) -> list[AuditEvent]:
    return [
        e
        for e in AuditEvent.objects.filter(action=action).order_by("sequence")
        if e.details.get("username") == username or e.actor_label == username
    ]


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
    created = _events(AuditAction.USER_CREATED, "alice")
    assert [e.details for e in created] == [{"username": "alice", "role": "viewer", "via": "sso"}]
    [login] = _events(AuditAction.LOGIN_SUCCEEDED, "alice")
    assert login.details == {"via": "sso"} and login.actor_user_id == alice.pk
    # Signed in: the login page sends them on.
    assert browser.get(f"{control_plane}/accounts/login/").url.path == "/"

    # Sign out (audited like a local sign-out), moved to operators at the provider, sign in.
    page = browser.get(f"{control_plane}/")
    browser.post(
        f"{control_plane}/accounts/logout/",
        data={"csrfmiddlewaretoken": _csrf(page.text)},
        headers={"referer": f"{control_plane}/"},
    )
    assert _events(AuditAction.LOGGED_OUT, "alice")
    provider.person("alice", "rl-operators")
    _, landed = sign_in_with_sso(control_plane, "alice")
    assert 'class="role role-operator">operator<' in landed.text
    alice.refresh_from_db()
    assert set(alice.groups.values_list("name", flat=True)) == {"operator"}
    [changed] = _events(AuditAction.USER_ROLE_CHANGED, "alice")
    assert changed.details == {"username": "alice", "role": "operator", "via": "sso"}
    assert changed.actor_label == "single sign-on"
    assert get_user_model().objects.filter(username="alice").count() == 1

    # Same groups again: nothing to change, nothing audited.
    sign_in_with_sso(control_plane, "alice")
    assert len(_events(AuditAction.USER_ROLE_CHANGED, "alice")) == 1

    # Out of every mapped group: the role goes and the sign-in is refused, with the reason.
    provider.person("alice", "unrelated-group")
    _, landed = sign_in_with_sso(control_plane, "alice")
    assert landed.url.path == "/accounts/login/"
    assert "none of your groups is given a role here any more" in landed.text
    assert 'class="role ' not in landed.text
    alice.refresh_from_db()
    assert role_of(alice) is None
    assert _events(AuditAction.USER_ROLE_CHANGED, "alice")[-1].details["role"] is None
    failed = _events(AuditAction.LOGIN_FAILED, "alice")[-1]
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
            "csrfmiddlewaretoken": _csrf(form.text),
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
