"""Global search in Chromium: "/" focuses the top-bar box from any page, Enter lands on the
grouped results, and each hit leads to its page."""

from __future__ import annotations

import pytest
from django.utils import timezone

from controlplane.fleet.models import Source, Worker
from controlplane.refresh.models import PolicyRefresh
from tests.conftest import PASSWORD
from tests.fixtures.live_server import sign_in

pytestmark = pytest.mark.browser

INSTANCE = "18446744073709551615"


def test_slash_focuses_search_and_hits_lead_to_their_pages(page, viewer, transactional_db):
    now = timezone.now()
    source = Source.objects.create(
        name="src-a", listener_url="http://127.0.0.1:9/", allowed_networks=["127.0.0.0/8"]
    )
    worker = Worker.objects.create(
        source=source,
        namespace="rl-search",
        component="backend",
        endpoint="generate",
        instance_id=INSTANCE,
        weight_version="step-4242",
        first_seen_at=now,
        last_seen_at=now,
    )
    refresh = PolicyRefresh.objects.create(
        source=source, namespaces=["rl-search"], target={"weight_version": "step-4242"}
    )

    sign_in(page, viewer.username, PASSWORD)
    page.goto("/refreshes/")
    page.keyboard.press("/")
    assert page.evaluate("document.activeElement.id") == "global-search"
    page.keyboard.type("rl-search/backend")
    page.keyboard.press("Enter")
    page.wait_for_url("**/search/?q=rl-search%2Fbackend")
    link = page.locator("#search-workers a", has_text=worker.key)
    assert link.count() == 1
    link.click()
    page.wait_for_url(f"**/workers/{worker.pk}/")

    # "/" typed inside a field stays a character.
    page.goto("/search/")
    page.locator("#search-page-q").fill("")
    page.locator("#search-page-q").press("/")
    assert page.locator("#search-page-q").input_value() == "/"

    page.goto(f"/search/?q=%23{refresh.pk}")
    page.locator("#search-refreshes a", has_text=f"#{refresh.pk}").click()
    page.wait_for_url(f"**/refreshes/{refresh.pk}/")

    page.goto("/search/?q=1844674407")
    assert page.locator("#search-instances a", has_text=INSTANCE).count() == 1
    page.goto("/search/?q=step-42")
    page.locator("#search-versions a.version-link", has_text="step-4242").click()
    page.wait_for_url("**/versions/step-4242/provenance/")
