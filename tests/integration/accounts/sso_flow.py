"""The real OpenID provider (django-oauth-toolkit, its own process, `tests/sso_idp`) and the
browser-like walk through the authorization-code flow, shared by the single sign-on tests."""

import json
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

from controlplane.audit.actions import AuditAction
from controlplane.audit.models import AuditEvent
from controlplane.embedded.redis import free_port
from tests.fixtures.live_server import ROOT, asgi_server

CLIENT_ID = "controlplane"
CLIENT_SECRET = "s" * 40
IDP_PASSWORD = "idp-password-123"
PROVIDER = "Test IdP"
#: How far the provider's clock may be ahead of or behind ours (OIDC_CLOCK_SKEW_SECONDS).
CLOCK_SKEW_SECONDS = 10


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

    def person(self, username: str, *groups: str, id_token: dict | None = None) -> None:
        """Create or update a person with exactly `groups`; `id_token` claims are laid over
        theirs (`exp`/`iat` as seconds from now, None drops a claim: tests/sso_idp/tweaks.py)."""
        tweaks = json.dumps(id_token or {})
        groups_arg = ",".join(groups)
        self.manage(
            "idp_user", username, IDP_PASSWORD, "--groups", groups_arg, "--id-token", tweaks
        )


@pytest.fixture(scope="module")
def provider_env() -> dict[str, str]:
    """Extra settings for the test provider (tests/sso_idp/settings.py); a module overrides
    this fixture to run a provider configured otherwise."""
    return {}


@pytest.fixture(scope="module")
def provider(tmp_path_factory, provider_env) -> Iterator[Provider]:
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
        **provider_env,
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
        OIDC_CLOCK_SKEW_SECONDS=str(CLOCK_SKEW_SECONDS),
    ) as url:
        provider.manage("idp_client", CLIENT_ID, CLIENT_SECRET, f"{url}/accounts/sso/callback/")
        yield url


def csrf_of(html: str) -> str:
    match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html)
    assert match, html
    return match.group(1)


def at_provider_login(app: str) -> tuple[httpx.Client, httpx.Response]:
    """A fresh browser: the control plane's button, on to the provider's login form."""
    browser = httpx.Client(follow_redirects=True, timeout=30)
    login_page = browser.get(f"{app}/accounts/login/")
    assert f"Sign in with {PROVIDER}" in login_page.text
    at_provider = browser.get(f"{app}/accounts/sso/login/")
    assert at_provider.url.host == "localhost", at_provider.url
    assert "/accounts/login/" in at_provider.url.path
    return browser, at_provider


def submit_provider_login(
    browser: httpx.Client, at_provider: httpx.Response, username: str, **kwargs
) -> httpx.Response:
    return browser.post(
        str(at_provider.url),
        data={
            "csrfmiddlewaretoken": csrf_of(at_provider.text),
            "username": username,
            "password": IDP_PASSWORD,
            "next": at_provider.url.params["next"],
        },
        headers={"referer": str(at_provider.url)},
        **kwargs,
    )


def sign_in_with_sso(app: str, username: str) -> tuple[httpx.Client, httpx.Response]:
    """A fresh browser: the control plane's button, the provider's login form, back again."""
    browser, at_provider = at_provider_login(app)
    return browser, submit_provider_login(browser, at_provider, username)


def callback_url_with_code(app: str, username: str) -> tuple[httpx.Client, str]:
    """A browser stopped just before the callback: the provider's redirect back, with a fresh
    authorization code and the state this browser's session expects, not yet followed."""
    browser, at_provider = at_provider_login(app)
    response = submit_provider_login(browser, at_provider, username, follow_redirects=False)
    return browser, _redirect_to_callback(browser, response, app)


def code_from_provider(idp: Provider, app: str, username: str) -> str:
    """An authorization code got straight from the provider's authorize endpoint, as anyone
    who can sign in there can: no state of ours, no nonce, no PKCE challenge."""
    params = {
        "response_type": "code",
        "client_id": CLIENT_ID,
        "redirect_uri": f"{app}/accounts/sso/callback/",
        "scope": "openid profile email",
        "state": "made-up",
    }
    browser = httpx.Client(follow_redirects=True, timeout=30)
    at_provider = browser.get(f"{idp.url}/o/authorize/", params=params)
    assert "/accounts/login/" in at_provider.url.path, at_provider.url
    response = submit_provider_login(browser, at_provider, username, follow_redirects=False)
    callback = _redirect_to_callback(browser, response, app)
    return httpx.URL(callback).params["code"]


def _redirect_to_callback(browser: httpx.Client, response: httpx.Response, app: str) -> str:
    while response.is_redirect:  # through the provider's own hops, up to the control plane's
        url = str(response.url.join(response.headers["location"]))
        if url.startswith(f"{app}/accounts/sso/callback/"):
            return url
        response = browser.get(url, follow_redirects=False)
    raise AssertionError(f"the provider did not send the browser back: {response.status_code}")


def events_for(action: AuditAction, username: str) -> list[AuditEvent]:
    """Audit rows of `action` about or by `username`, oldest first."""
    return [
        e
        for e in AuditEvent.objects.filter(action=action).order_by("sequence")
        if e.details.get("username") == username or e.actor_label == username
    ]
