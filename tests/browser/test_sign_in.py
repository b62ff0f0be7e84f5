"""A person signs in through the real page in Chromium and lands on the fleet overview."""

import pytest

from tests.conftest import PASSWORD
from tests.fixtures.live_server import sign_in

pytestmark = pytest.mark.browser


def test_viewer_signs_in_and_sees_their_role(page, viewer):
    sign_in(page, viewer.username, PASSWORD)
    assert page.locator("h1").first.inner_text() == "Fleet"
    assert page.locator(".whoami .role").inner_text() == "viewer"


def test_wrong_password_stays_on_the_login_page(page, viewer):
    page.goto("/accounts/login/")
    page.fill("#id_username", viewer.username)
    page.fill("#id_password", "not-the-password")
    page.click("button[type=submit]")
    assert page.locator(".form-error").is_visible()
    assert "/accounts/login/" in page.url
