"""The pages that list workers, at 10,000 workers: each answers one page of rows or a
summary, so a response's rows and bytes stay bounded whatever the fleet's size."""

from __future__ import annotations

import pytest
from django.urls import reverse

from controlplane.fleet.filters import PAGE_SIZE
from controlplane.fleet.live import TIMELINE_LIMIT
from tests.fixtures.scale import make_events, make_fleet, make_refresh, make_source

WORKERS = 10_000
#: The first screen's budget (docs/decisions/2026-11-30-big-pages.md).
PAGE_BYTES = 250_000


@pytest.fixture
def source(db):
    source = make_source("ten-thousand", expected_prefix="rl")
    make_fleet(source, WORKERS)
    return source


def test_source_page_at_10000_workers_is_one_page_and_the_map_a_compact_payload(
    viewer_client, source
):
    make_events(source, TIMELINE_LIMIT)
    url = reverse("fleet:source", args=[source.pk])
    first = viewer_client.get(url)
    html = first.content.decode()
    assert html.count('<tr id="worker-') == PAGE_SIZE
    assert len(first.content) < PAGE_BYTES, len(first.content)
    # The summary counts the whole fleet through aggregates; the last page is a page too.
    assert "8000 live" in html and "2000 erroring" in html
    pages = WORKERS // PAGE_SIZE
    assert f"page 1 of {pages}" in html
    last = viewer_client.get(f"{url}?page={pages}")
    assert last.content.decode().count('<tr id="worker-') == PAGE_SIZE
    assert len(last.content) < PAGE_BYTES

    # The map, loaded after the first screen, carries every worker but no markup per worker:
    # under 40 bytes a worker (its id, key, state and version as indexes; the SVG it replaced
    # took ~170).
    fragment = viewer_client.get(
        reverse("fleet:source_map", args=[source.pk]), headers={"HX-Request": "true"}
    ).content
    assert len(fragment) < 40 * WORKERS, len(fragment)
    assert b'href="/workers/' not in fragment and b"<rect" not in fragment
    assert f"{WORKERS:,} workers: 8,000 live".encode() in fragment
    # The source page's map fetches the same payload as JSON (preloaded by the page's head).
    data = viewer_client.get(reverse("fleet:source_map_data", args=[source.pk])).content
    assert len(data) < 40 * WORKERS, len(data)
    assert f"{WORKERS:,} workers: 8,000 live".encode() in data
    assert b'"cells"' not in first.content  # not inlined into the first screen


def test_overview_and_refresh_page_at_10000_workers_stay_small(viewer_client, source):
    overview = viewer_client.get(reverse("fleet:overview"))
    assert len(overview.content) < PAGE_BYTES, len(overview.content)
    assert b'<tr id="worker-' not in overview.content

    refresh = make_refresh(source, WORKERS)
    page = viewer_client.get(reverse("refresh:detail", args=[refresh.pk]))
    html = page.content.decode()
    assert html.count('<tr id="worker-row-') == PAGE_SIZE
    assert len(page.content) < PAGE_BYTES, len(page.content)
