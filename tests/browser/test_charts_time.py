"""A person opens a big source page in Tokyo: the fleet map draws every worker, and times
read in Tokyo's zone with UTC kept on hover."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from controlplane.audit.recorder import Actor
from controlplane.fleet import services
from controlplane.fleet.models import Source
from tests.conftest import PASSWORD
from tests.fixtures.live_server import sign_in
from tests.fixtures.scale import make_fleet

pytestmark = pytest.mark.browser


@pytest.fixture
def tokyo_page(_browser, live_server_url):
    context = _browser.new_context(base_url=live_server_url, timezone_id="Asia/Tokyo")
    context.set_default_timeout(15_000)
    page = context.new_page()
    yield page
    context.close()


def test_fleet_map_at_2000_workers_and_times_in_the_viewers_zone(tokyo_page, viewer):
    page = tokyo_page
    source = services.create_source(
        actor=Actor.system("test"),
        name="big",
        listener_url="http://10.0.0.5:8001",
        allowed_networks=["10.0.0.0/8"],
    )
    make_fleet(source, 2000)
    finished = timezone.now().replace(microsecond=0) - dt.timedelta(minutes=3)
    Source.objects.filter(pk=source.pk).update(last_discovery_finished_at=finished)

    sign_in(page, viewer.username, PASSWORD)
    page.goto(f"/sources/{source.pk}/")
    drawn = page.locator("#fleet-map-cells [data-fleet-map][data-drawn]")
    drawn.wait_for(state="attached")
    assert drawn.get_attribute("data-drawn") == "2000"
    # A cell names its worker and links to it (tests/browser/test_fleet_map.py: every cell).
    page.locator("#fleet-map-cells canvas").hover(position={"x": 4, "y": 4})
    href = page.locator("#fleet-map-cells .fleet-map-focus").get_attribute("data-href")
    assert href is not None and href.startswith("/workers/"), href

    # The summary's "last discovery" time reads in Tokyo (UTC+9, "GMT+9" or "JST"),
    # with the UTC moment on hover.
    node = page.locator("#source-summary time[data-local]").first
    page.wait_for_selector("#source-summary time[data-localised]")
    tokyo = finished.astimezone(dt.timezone(dt.timedelta(hours=9)))
    text = node.inner_text()
    assert text.startswith(tokyo.strftime("%H:%M:%S")), text
    assert "UTC" not in text and ("GMT+9" in text or "JST" in text), text
    assert node.get_attribute("title") == f"{finished.astimezone(dt.UTC):%Y-%m-%d %H:%M:%S} UTC"
