"""The Content-Security-Policy: what it says, and that every kind of response carries it."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.security.hostile import csp_problems

pytestmark = pytest.mark.django_db


def directives(response) -> dict[str, str]:
    header = response["Content-Security-Policy"]
    parts = (d.strip().partition(" ") for d in header.split(";") if d.strip())
    return {name: values for name, _, values in parts}


def test_pages_get_a_strict_policy(admin_client):
    policy = directives(admin_client.get("/"))
    assert policy == {
        "default-src": "'self'",
        "script-src": "'self'",  # no inline script anywhere, so no nonce is emitted either
        "style-src": "'self'",
        "img-src": "'self'",
        "connect-src": "'self'",  # same-origin websockets (CSP Level 3 'self' covers ws/wss)
        "object-src": "'none'",
        "base-uri": "'self'",
        "frame-ancestors": "'none'",
        "form-action": "'self'",
    }


@pytest.mark.parametrize(
    ("who", "path", "status"),
    [
        ("anonymous", "/accounts/login/", 200),
        ("anonymous", "/", 302),
        ("anonymous", "/api/v1/sources", 401),
        ("viewer", "/admin-tools/tokens/", 403),
        ("viewer", "/no-such-page/", 404),
        ("viewer", "/refreshes/999999/", 404),
        ("viewer", "/api/v1/refreshes/999999", 404),
        ("viewer", "/api/v1/openapi.json", 200),
        ("viewer", "/static/js/app.js", 200),
    ],
)
def test_every_kind_of_response_carries_it(who, path, status, viewer):
    client = Client()
    if who == "viewer":
        client.force_login(viewer)
    response = client.get(path)
    assert response.status_code == status
    assert csp_problems(response) == []


def test_a_page_that_uses_the_nonce_gets_it_in_the_header(rf):
    """The nonce reaches the header only when a template used it (Django's lazy nonce), so a
    future inline script written as `<script nonce="{{ csp_nonce }}">` works unchanged."""
    from django.middleware.csp import ContentSecurityPolicyMiddleware
    from django.template import engines

    def view(request):
        from django.http import HttpResponse

        template = engines["django"].from_string('<script nonce="{{ csp_nonce }}"></script>')
        return HttpResponse(template.render({}, request))

    request = rf.get("/")
    response = ContentSecurityPolicyMiddleware(view)(request)
    nonce = response.content.decode().split('"')[1]
    assert f"'nonce-{nonce}'" in directives(response)["script-src"]
    assert "'unsafe-inline'" not in directives(response)["script-src"]
