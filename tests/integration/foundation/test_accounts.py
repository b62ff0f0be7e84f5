"""Sign-in, roles, throttling and the access rules every page follows."""

import io

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client, override_settings
from django.urls import URLPattern, URLResolver, get_resolver

from controlplane.accounts.roles import ROLE_PERMISSIONS, Perm, Role
from controlplane.audit.models import AuditEvent
from tests.conftest import PASSWORD

pytestmark = pytest.mark.django_db


def test_role_groups_grant_exactly_their_permissions(viewer, operator, approver, admin_user):
    for user, role in (
        (viewer, Role.VIEWER),
        (operator, Role.OPERATOR),
        (approver, Role.APPROVER),
        (admin_user, Role.ADMIN),
    ):
        granted = {p for p in Perm if user.has_perm(p.value)}
        assert granted == set(ROLE_PERMISSIONS[role]), role


def test_login_with_valid_credentials_redirects_and_audits(viewer):
    client = Client()
    response = client.post("/accounts/login/", {"username": viewer.username, "password": PASSWORD})
    assert response.status_code == 302
    assert client.get("/").status_code == 200
    assert AuditEvent.objects.filter(action="auth.login_succeeded", actor_user=viewer).exists()


def test_wrong_password_is_refused_and_audited(viewer):
    response = Client().post("/accounts/login/", {"username": viewer.username, "password": "nope"})
    assert response.status_code == 401
    assert AuditEvent.objects.filter(action="auth.login_failed").count() == 1


@override_settings(LOGIN_THROTTLE_ATTEMPTS=3)
def test_failed_logins_are_throttled_even_with_the_right_password(viewer):
    client = Client()
    for _ in range(3):
        client.post("/accounts/login/", {"username": viewer.username, "password": "bad"})
    response = client.post("/accounts/login/", {"username": viewer.username, "password": PASSWORD})
    assert response.status_code == 429
    assert "Too many failed sign-in attempts" in response.content.decode()
    assert client.get("/").status_code == 302  # still not signed in


def test_login_next_parameter_cannot_redirect_off_site(viewer):
    response = Client().post(
        "/accounts/login/?next=https://evil.example/",
        {"username": viewer.username, "password": PASSWORD},
    )
    assert response["Location"] == "/"


def test_logout_requires_post(viewer_client):
    assert viewer_client.get("/accounts/logout/").status_code == 405
    assert viewer_client.post("/accounts/logout/").status_code == 302
    assert viewer_client.get("/").status_code == 302


def _all_patterns(resolver=None, prefix=""):
    resolver = resolver or get_resolver()
    for entry in resolver.url_patterns:
        if isinstance(entry, URLResolver):
            yield from _all_patterns(entry, prefix + str(entry.pattern))
        elif isinstance(entry, URLPattern):
            yield prefix + str(entry.pattern), entry


def _concrete(route: str) -> str:
    import re

    route = re.sub(r"<int:[^>]+>", "1", route)
    route = re.sub(r"<(?:str|slug):[^>]+>", "x", route)
    route = re.sub(r"<[^>]+>", "x", route)
    return "/" + route.lstrip("^").rstrip("$")


# Paths that must answer without a session: sign-in itself (the password form and the single
# sign-on start and callback) and machine-facing endpoints that carry their own authentication
# (bearer tokens, webhook signatures, a scraper address list).
# /favicon.ico only sends to the static icon.
PUBLIC_PREFIXES = (
    "/accounts/login/",
    "/accounts/sso/",
    "/api/",
    "/static/",
    "/metrics",
    "/favicon.ico",
)


def test_every_page_requires_sign_in():
    client = Client()
    checked = 0
    for route, _pattern in _all_patterns():
        path = _concrete(route)
        if path.startswith(PUBLIC_PREFIXES):
            continue
        response = client.get(path)
        assert response.status_code in (302, 405), (path, response.status_code)
        if response.status_code == 302:
            assert response["Location"].startswith("/accounts/login/"), path
        checked += 1
    assert checked >= 3


def test_create_user_command_reads_password_from_stdin(monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("a-long-and-unusual-passphrase\n"))
    call_command(
        "create_user", "alice", "--role", "operator", "--password-stdin", stdout=io.StringIO()
    )
    alice = get_user_model().objects.get(username="alice")
    assert alice.check_password("a-long-and-unusual-passphrase")
    assert alice.has_perm(Perm.OPERATE_REFRESH.value)
    assert not alice.has_perm(Perm.APPROVE_REFRESH.value)
    assert AuditEvent.objects.filter(action="user.created", target_id=str(alice.pk)).exists()


def test_create_user_command_rejects_weak_password_and_changes_nothing(monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("123\n"))
    with pytest.raises(CommandError):
        call_command("create_user", "bob", "--role", "viewer", "--password-stdin")
    assert not get_user_model().objects.filter(username="bob").exists()
    assert not AuditEvent.objects.exists()


def test_a_process_without_the_test_flag_hashes_with_pbkdf2():
    """The test runs' cheap hasher is opt-in by environment; the product default stays PBKDF2,
    and production ignores the flag."""
    import os
    import subprocess
    import sys

    probe = (
        "import django; django.setup(); from django.conf import settings; "
        "print(settings.PASSWORD_HASHERS[0])"
    )
    pbkdf2 = "django.contrib.auth.hashers.PBKDF2PasswordHasher"

    def first_hasher(env: dict[str, str]) -> str:
        env = {**env, "DJANGO_SETTINGS_MODULE": "controlplane.settings"}
        run = subprocess.run(
            [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
        )
        return run.stdout.strip()

    plain = {k: v for k, v in os.environ.items() if k != "CONTROLPLANE_TEST_FAST_HASHER"}
    assert first_hasher(plain) == pbkdf2
    assert first_hasher({**plain, "CONTROLPLANE_TEST_FAST_HASHER": "1"}) != pbkdf2
    production = {
        **plain,
        "CONTROLPLANE_TEST_FAST_HASHER": "1",
        "CONTROLPLANE_ENV": "production",
        "SECRET_KEY": "a-production-secret-" + "x7Q!" * 12,
        "ALLOWED_HOSTS": "cp.example",
        "AUDIT_HMAC_KEY": "k1:" + "a-long-audit-secret-" * 3,
    }
    production.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test")
    assert first_hasher(production) == pbkdf2
