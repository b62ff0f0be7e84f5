"""The source page at fleet scale: one page at a time, every worker still reachable."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from controlplane.audit.recorder import Actor
from controlplane.fleet import services
from controlplane.fleet.filters import PAGE_SIZE
from controlplane.fleet.live import TIMELINE_LIMIT
from controlplane.fleet.models import Worker, WorkerState
from tests.fixtures.scale import make_events, make_fleet


@pytest.fixture
def source(db):
    return services.create_source(
        actor=Actor.system("test"),
        name="big",
        listener_url="http://10.0.0.5:8001",
        allowed_networks=["10.0.0.0/8"],
        expected_prefix="rl",
    )


def fleet(source, n: int) -> None:
    """`n` workers in 4 namespaces, 3 versions, every fifth erroring, mixed id lengths."""
    make_fleet(source, n)


ROW_IID = re.compile(r'<div class="mono iid">(\d+)</div>')
NEXT = re.compile(r'<a href="\?([^"]+)"[^>]*rel="next"')


def walk(client, url: str, query: str = "") -> list[str]:
    """Every instance id, following the pager's "next" links from the first page."""
    seen: list[str] = []
    while True:
        html = client.get(f"{url}?{query}").content.decode()
        seen += ROW_IID.findall(html)
        found = NEXT.search(html)
        if not found:
            return seen
        query = found.group(1).replace("&amp;", "&")


def test_first_screen_at_2000_workers_is_one_small_page(viewer_client, source):
    fleet(source, 2000)
    make_events(source, TIMELINE_LIMIT)  # a full membership timeline too
    response = viewer_client.get(reverse("fleet:source", args=[source.pk]))
    html = response.content.decode()
    assert html.count('<tr id="worker-') == PAGE_SIZE
    assert len(response.content) < 250_000, len(response.content)
    # The summary counts the whole fleet, not the page, through aggregates.
    assert "1600 live" in html and "400 erroring" in html
    assert "1\u2013100 of 2000 · page 1 of 20" in html
    assert 'ws-connect="/ws/fleet/sources/' in html


def test_paging_reaches_every_worker_once_in_numeric_order(viewer_client, source):
    fleet(source, 450)
    url = reverse("fleet:source", args=[source.pk])
    ids = walk(viewer_client, url, "sort=namespace")
    assert sorted(ids) == sorted(w.instance_id for w in Worker.objects.all())
    assert len(ids) == len(set(ids)) == 450
    # Within a namespace, instance ids run in numeric order across pages (7 < 3995 < 10976).
    rl0 = [int(i) for i in ids if (int(i) - 7) // 997 % 4 == 0]
    assert rl0 == sorted(rl0)


def test_filters_and_search_reach_exactly_the_matching_workers(viewer_client, source):
    fleet(source, 600)
    url = reverse("fleet:source", args=[source.pk])
    expected = {
        w.instance_id
        for w in Worker.objects.filter(namespace="rl-1", state=WorkerState.ERRORING)
        if w.weight_version == "step-2"
    }
    got = walk(viewer_client, url, "namespace=rl-1&state=erroring&version=step-2")
    assert set(got) == expected and len(got) == len(expected) > 0

    flushable = walk(viewer_client, url, "route=flush_cache")
    assert set(flushable) == {
        w.instance_id for w in Worker.objects.all() if "flush_cache" in w.routes
    }

    target = Worker.objects.order_by("?").first()
    assert walk(viewer_client, url, f"q={target.instance_id}") == [target.instance_id]
    assert len(walk(viewer_client, url, "q=MODEL-1")) == 300  # case-insensitive, by model


def test_filtered_page_is_a_link_and_bad_page_numbers_show_a_real_page(viewer_client, source):
    fleet(source, 250)
    url = reverse("fleet:source", args=[source.pk])
    html = viewer_client.get(url, {"namespace": "rl-2", "sort": "-version"}).content.decode()
    # The live socket follows the same view, and the pager keeps every parameter.
    assert f'ws-connect="/ws/fleet/sources/{source.pk}/?namespace=rl-2&amp;sort=-version"' in html
    for bad in ("0", "-3", "abc", "999"):
        response = viewer_client.get(url, {"page": bad})
        assert response.status_code == 200
        assert response.content.decode().count('<tr id="worker-') > 0, bad
    last = viewer_client.get(url, {"page": "999"}).content.decode()
    assert "page 3 of 3" in last and last.count('<tr id="worker-') == 50


def test_htmx_paging_returns_the_table_partial_only(viewer_client, source):
    fleet(source, 150)
    url = reverse("fleet:source", args=[source.pk])
    html = viewer_client.get(url, {"page": "2"}, headers={"HX-Request": "true"}).content.decode()
    assert "<html" not in html and 'id="source-summary"' not in html
    assert html.count('<tr id="worker-') == 50 and "page 2 of 2" in html
    assert f'ws-connect="/ws/fleet/sources/{source.pk}/?page=2"' in html


def test_json_versions_filter_by_their_label(viewer_client, source):
    fleet(source, 3)
    Worker.objects.filter(instance_id="7").update(weight_version={"step": 9})
    Worker.objects.filter(instance_id="1004").update(weight_version=None)
    url = reverse("fleet:source", args=[source.pk])
    html = viewer_client.get(url).content.decode()
    assert "undeclared (1)" in html and "{&quot;step&quot;: 9} (1)" in html
    assert walk(viewer_client, url, 'version={"step": 9}') == ["7"]
    assert walk(viewer_client, url, "version=undeclared") == ["1004"]
