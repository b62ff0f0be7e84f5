"""Error pages render inside the layout, under the CSP; the 500 page needs no request at all."""

from __future__ import annotations

import pytest
from django.test import Client, RequestFactory

from controlplane.errors import server_error

pytestmark = pytest.mark.django_db


def test_403_for_a_viewer_on_an_admin_page_is_inside_the_layout(viewer_client):
    response = viewer_client.get("/admin-tools/tokens/")
    assert response.status_code == 403
    html = response.content.decode()
    assert 'id="error-403"' in html and "Not permitted" in html
    assert 'class="mainnav"' in html and "Sign out" in html  # the layout, signed in
    assert "<strong>viewer</strong>" in html  # says which role lacked it
    assert "script-src 'self'" in response["Content-Security-Policy"]


def test_404_is_inside_the_layout(viewer_client):
    response = viewer_client.get("/no-such-page/")
    assert response.status_code == 404
    html = response.content.decode()
    assert 'id="error-404"' in html and 'class="mainnav"' in html
    assert "/static/css/app.css" in html


def test_500_renders_without_session_user_or_database(django_assert_num_queries):
    request = RequestFactory().get("/boom/")  # no session, no user: middleware never ran
    with django_assert_num_queries(0):
        response = server_error(request)
    assert response.status_code == 500
    html = response.content.decode()
    assert 'id="error-500"' in html and "/static/css/app.css" in html
    assert "Sign out" not in html and 'class="mainnav"' not in html


def test_500_still_answers_when_the_template_layer_fails(monkeypatch):
    def broken(name):
        raise RuntimeError("templates unavailable")

    monkeypatch.setattr("controlplane.errors.loader.get_template", broken)
    response = server_error(RequestFactory().get("/boom/"))
    assert response.status_code == 500
    assert b"Server error" in response.content


def test_csrf_failure_is_a_styled_page_that_says_what_to_do(viewer):
    client = Client(enforce_csrf_checks=True)
    client.force_login(viewer)
    response = client.post("/accounts/logout/")
    assert response.status_code == 403
    html = response.content.decode()
    assert 'id="error-403"' in html and "This form expired" in html
    assert 'class="mainnav"' in html


def test_gates_are_in_the_navigation_and_marked_current(viewer_client):
    html = viewer_client.get("/refreshes/gates/").content.decode()
    assert 'href="/refreshes/gates/" aria-current="page">Gates</a>' in html
    assert 'href="/refreshes/" >Policy refreshes</a>' in html  # not current here
    listing = viewer_client.get("/refreshes/").content.decode()
    assert 'href="/refreshes/" aria-current="page">Policy refreshes</a>' in listing


def test_every_page_has_a_polite_connection_banner_and_a_skip_link(viewer_client):
    html = viewer_client.get("/").content.decode()
    assert 'id="connection" class="connection" role="status" aria-live="polite"' in html
    assert 'class="skip-link" href="#main"' in html


def test_every_page_links_an_icon_that_is_served(viewer_client):
    html = viewer_client.get("/").content.decode()
    assert '<link rel="icon" href="/static/favicon.svg" type="image/svg+xml">' in html
    icon = Client().get("/static/favicon.svg")
    assert icon.status_code == 200 and b"<svg" in b"".join(icon.streaming_content)
    # Whatever still asks for /favicon.ico (signed in or not) is sent to it, not a 404.
    old_name = Client().get("/favicon.ico")
    assert old_name.status_code == 301 and old_name["Location"] == "/static/favicon.svg"
