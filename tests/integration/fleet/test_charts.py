"""The fleet's and refreshes' charts: they parse, count what the data says, escape what comes
from outside, and cost the same number of queries at 10 and 2,000 workers. The fleet map is a
payload the page's script draws (tests/browser/test_fleet_map.py draws it): here it is decoded
the way the script decodes it."""

from __future__ import annotations

import datetime as dt
import json
import re
from collections import Counter
from html.parser import HTMLParser
from typing import NamedTuple
from xml.etree import ElementTree

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from controlplane.audit.recorder import Actor
from controlplane.fleet import charts, services
from controlplane.fleet.models import DiscoveryRun, Worker, WorkerState
from controlplane.refresh.models import PolicyRefresh, RefreshState, StepRun
from tests.fixtures.scale import NAMESPACES, make_fleet

SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture
def source(db):
    return services.create_source(
        actor=Actor.system("test"),
        name="charts",
        listener_url="http://10.0.0.5:8001",
        allowed_networks=["10.0.0.0/8"],
        expected_prefix="rl",
    )


def svgs(html: str, figure_id: str) -> ElementTree.Element:
    """The one `<svg>` inside `<figure id=...>` (or the page fragment), parsed as XML."""
    start = html.index(f'id="{figure_id}"') if figure_id else 0
    begin = html.index("<svg", start)
    end = html.index("</svg>", begin) + len("</svg>")
    return ElementTree.fromstring(html[begin:end])


def rects(svg: ElementTree.Element, cls: str) -> list[ElementTree.Element]:
    return [r for r in svg.iter(f"{SVG}rect") if cls in (r.get("class") or "").split()]


def title(el: ElementTree.Element) -> str:
    found = el.find(f"{SVG}title")
    assert found is not None
    return found.text or ""


class MapCell(NamedTuple):
    href: str
    title: str
    cls: str


class _MapParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.attrs: dict[str, dict[str, str | None]] = {}

    def handle_starttag(self, tag, attrs):
        found = dict(attrs)
        for cls in (found.get("class") or "").split():
            self.attrs.setdefault(cls, found)


def fleet_map(fragment: str) -> tuple[list[MapCell], dict[str, dict[str, str | None]]]:
    """The map's cells as static/js/fleet_map.js reads them (href, tooltip, colour class) from
    the fragment's payload, and each first element's attributes by class."""
    parser = _MapParser()
    parser.feed(fragment)
    data = json.loads(parser.attrs["fleet-map"]["data-fleet-map"] or "")
    before, after = data["href"].split("{}")
    flat, stride = data["cells"], charts.CELL_FIELDS
    cells = [
        MapCell(
            f"{before}{pk}{after}",
            f"{data['prefixes'][p]}{iid} · {data['states'][s]} · {data['versions'][v]}",
            data["classes"][c],
        )
        for pk, p, iid, s, v, c in (flat[i : i + stride] for i in range(0, len(flat), stride))
    ]
    return cells, parser.attrs


def test_version_chart_has_one_bar_per_namespace_split_by_version(viewer_client, source):
    make_fleet(source, 20)  # namespace rl-(i % 4), version step-(i % 3)
    Worker.objects.filter(instance_id__in=Worker.objects.values("instance_id")[:1]).update(
        state=WorkerState.GONE
    )
    gone = Worker.objects.get(state=WorkerState.GONE)
    present = Worker.objects.exclude(state=WorkerState.GONE)
    expected = Counter((w.namespace, w.weight_version) for w in present)

    html = viewer_client.get(reverse("fleet:source", args=[source.pk])).content.decode()
    svg = svgs(html, "version-chart")
    bars = rects(svg, "chart-bar")
    assert len(bars) == len(expected)
    titles = sorted(title(b) for b in bars)
    per_ns = Counter()
    for (ns, _), n in expected.items():
        per_ns[ns] += n
    assert titles == sorted(
        f"{ns}: {v}: {n} ({100 * n / per_ns[ns]:.0f}%)" for (ns, v), n in expected.items()
    )
    labels = [t.text for t in svg.iter(f"{SVG}text") if t.get("class") == "chart-label"]
    assert labels == [f"rl-{k}" for k in range(NAMESPACES)]
    # the gone worker is not counted: its namespace's total is one less
    totals = [t.text for t in svg.iter(f"{SVG}text") if t.get("class") == "chart-value"]
    assert totals[int(gone.namespace[-1])] == str(per_ns[gone.namespace])
    assert per_ns[gone.namespace] == 4


def test_overview_version_chart_names_source_and_namespace(viewer_client, source):
    make_fleet(source, 8)
    html = viewer_client.get(reverse("fleet:overview")).content.decode()
    svg = svgs(html, "version-chart")
    labels = [t.text for t in svg.iter(f"{SVG}text") if t.get("class") == "chart-label"]
    assert labels == [f"charts / rl-{k}" for k in range(NAMESPACES)]


def test_fleet_map_has_one_linked_cell_per_present_worker(viewer_client, source):
    make_fleet(source, 30)
    Worker.objects.filter(pk=Worker.objects.order_by("pk").first().pk).update(
        state=WorkerState.GONE
    )
    page = viewer_client.get(reverse("fleet:source", args=[source.pk])).content.decode()
    map_url = reverse("fleet:source_map", args=[source.pk])
    data_url = reverse("fleet:source_map_data", args=[source.pk])
    # The source page carries the map's frame, not its data: its head preloads the data's URL
    # (with the credentials the script fetches it with), and without a script it links the
    # map's own page.
    assert (
        f'<link rel="preload" href="{data_url}" as="fetch" crossorigin="use-credentials" '
        "data-fleet-map-data>" in page[: page.index("</head>")]
    )
    assert f'data-fleet-map="" data-fleet-map-src="{data_url}"' in page
    assert f'<a href="{map_url}">' in page and "rl-0/" not in page.split('id="fleet-map"')[1][:2000]

    html = viewer_client.get(map_url, headers={"HX-Request": "true"}).content.decode()
    assert "<html" not in html
    cells, attrs = fleet_map(html)
    present = Worker.objects.exclude(state=WorkerState.GONE)
    assert len(cells) == present.count() == 29
    assert attrs["fleet-map-cells"]["aria-label"].startswith("Fleet map: 29 workers")
    # Identity order, as the SVG drew them.
    ordered = present.order_by("namespace", "component", "endpoint", "instance_id")
    assert [c.href for c in cells] == [reverse("fleet:worker", args=[w.pk]) for w in ordered]
    by_href = {c.href: c for c in cells}
    for w in present:
        cell = by_href[reverse("fleet:worker", args=[w.pk])]
        assert cell.title == f"{w.key} · {w.state} · {w.weight_version}"
        if w.state == WorkerState.ERRORING:
            assert cell.cls == "chart-erroring"
        else:
            assert cell.cls.startswith("chart-v")
    # Same version, same colour: the map's classes follow one mapping.
    colour = {}
    for w in present.filter(state=WorkerState.LIVE):
        cls = by_href[reverse("fleet:worker", args=[w.pk])].cls
        assert colour.setdefault(w.weight_version, cls) == cls
    assert len(set(colour.values())) == 3
    # The text alternative counts what the map shows.
    live = Counter(w.weight_version for w in present.filter(state=WorkerState.LIVE))
    erroring = present.filter(state=WorkerState.ERRORING).count()
    assert f"29 workers: {live.total()} live (" in html
    assert all(f"{v}: {n}" in html for v, n in live.items())
    assert f"{erroring} erroring." in html
    # Without htmx the map is a page of its own, inside the layout.
    full = viewer_client.get(map_url).content.decode()
    assert "<html" in full and len(fleet_map(full)[0]) == 29


def test_the_map_data_is_the_fragments_payload_with_its_summary_and_legend(viewer_client, source):
    make_fleet(source, 30)
    fragment = viewer_client.get(
        reverse("fleet:source_map", args=[source.pk]), headers={"HX-Request": "true"}
    ).content.decode()
    parser = _MapParser()
    parser.feed(fragment)
    inline = json.loads(parser.attrs["fleet-map"]["data-fleet-map"] or "")
    answer = viewer_client.get(reverse("fleet:source_map_data", args=[source.pk]))
    assert answer["Content-Type"] == "application/json"
    data = answer.json()
    assert {k: data[k] for k in inline} == inline
    assert data["count"] == 30 and data["summary"].startswith("30 workers: ")
    assert data["summary"] in fragment
    legend = [name for name, _ in data["legend"]]
    assert [cls for _, cls in data["legend"]][-1] == "chart-erroring"
    assert all(f"</span> {name}</li>" in fragment for name in legend)
    # Signed out: not the data (the login page's redirect, which the script reports).
    signed_out = Client().get(reverse("fleet:source_map_data", args=[source.pk]))
    assert signed_out.status_code == 302 and b"rl-0" not in signed_out.content


def test_fleet_map_query_count_is_flat(viewer_client, source, django_assert_max_num_queries):
    url = reverse("fleet:source_map", args=[source.pk])
    make_fleet(source, 10)
    viewer_client.get(url)
    with django_assert_max_num_queries(20) as small:
        viewer_client.get(url, headers={"HX-Request": "true"})
    Worker.objects.all().delete()
    make_fleet(source, 2000)
    with django_assert_max_num_queries(len(small.captured_queries)) as large:
        html = viewer_client.get(url, headers={"HX-Request": "true"}).content.decode()
    assert len(large.captured_queries) == len(small.captured_queries)
    assert len(fleet_map(html)[0]) == 2000


def test_hostile_versions_and_namespaces_are_escaped_in_charts(viewer_client, source):
    now = timezone.now()
    hostile_ns = 'rl-<script>alert("ns")</script>'
    hostile_v = '"><svg onload=alert(1)>&amp;'
    Worker.objects.create(
        source=source,
        namespace=hostile_ns,
        component="backend",
        endpoint="generate",
        instance_id="1",
        weight_version=hostile_v,
        first_seen_at=now,
        last_seen_at=now,
    )
    html = viewer_client.get(reverse("fleet:source", args=[source.pk])).content.decode()
    svg = svgs(html, "version-chart")  # parses: nothing broke out of text or attributes
    assert [title(b) for b in rects(svg, "chart-bar")] == [f"{hostile_ns}: {hostile_v}: 1 (100%)"]
    assert "<script>alert" not in html and "<svg onload" not in html
    fragment = viewer_client.get(
        reverse("fleet:source_map", args=[source.pk]), headers={"HX-Request": "true"}
    ).content.decode()
    (cell,) = fleet_map(fragment)[0]
    assert cell.title == f"{hostile_ns}/backend/generate/1 · live · {hostile_v}"
    assert "<svg onload" not in fragment and "<script>alert" not in fragment


def test_refresh_history_and_discovery_latency_on_the_source_page(viewer_client, source):
    now = timezone.now()
    refreshes = []
    for i in range(22):
        refreshes.append(
            PolicyRefresh.objects.create(
                source=source,
                namespaces=["rl-0"],
                target={"weight_version": f"step-{i}", "method": "disk", "model_path": "/c"},
                state=RefreshState.FAILED if i == 21 else RefreshState.SUCCEEDED,
                started_at=now - dt.timedelta(minutes=100 - i),
                finished_at=now - dt.timedelta(minutes=100 - i) + dt.timedelta(seconds=i + 1),
            )
        )
    PolicyRefresh.objects.create(  # planned, never started: no bar
        source=source, namespaces=["rl-0"], target={"weight_version": "x", "method": "disk"}
    )
    for i in range(5):
        DiscoveryRun.objects.create(
            source=source,
            trigger="schedule",
            started_at=now - dt.timedelta(minutes=10 - i),
            duration_ms=10.0 * (i + 1),
            ok=i != 3,
        )
    html = viewer_client.get(reverse("fleet:source", args=[source.pk])).content.decode()
    bars = rects(svgs(html, "refresh-history"), "chart-bar")
    assert len(bars) == 20  # the last 20 that started, oldest first
    assert title(bars[0]).startswith(f"#{refreshes[2].pk} step-2 · succeeded · 3.0 s")
    assert title(bars[-1]).startswith(f"#{refreshes[21].pk} step-21 · failed · 22.0 s")
    assert "chart-failed" in bars[-1].get("class").split()
    heights = [float(b.get("height")) for b in bars]
    assert heights == sorted(heights)  # durations grow with i
    spark = svgs(html, "discovery-latency")
    dots = list(spark.iter(f"{SVG}circle"))
    assert [title(d).split(" · ")[1] for d in dots] == ["10 ms", "20 ms", "30 ms", "40 ms", "50 ms"]
    assert title(dots[3]).endswith(" · failed")
    assert spark.find(f"{SVG}polyline") is not None


def test_refresh_page_shows_clock_and_phase_timeline(viewer_client, source):
    now = timezone.now()
    started = now - dt.timedelta(seconds=90)
    refresh = PolicyRefresh.objects.create(
        source=source,
        namespaces=["rl-0"],
        target={"weight_version": "v9", "method": "disk", "model_path": "/c"},
        state=RefreshState.SUCCEEDED,
        started_at=started,
        finished_at=started + dt.timedelta(seconds=75),
    )
    steps = [("gate", "ok", 0, 5), ("pause", "ok", 5, 20), ("update", "failed", 20, 30)]
    steps += [("update", "ok", 40, 70)]
    for attempt, (name, status, a, b) in enumerate(steps):
        StepRun.objects.create(
            refresh=refresh,
            name=name,
            status=status,
            attempt=2 if attempt == 3 else 1,
            started_at=started + dt.timedelta(seconds=a),
            finished_at=started + dt.timedelta(seconds=b),
            duration_ms=(b - a) * 1000,
        )
    html = viewer_client.get(reverse("refresh:detail", args=[refresh.pk])).content.decode()
    assert 'id="refresh-elapsed">1 min 15 s' in html
    start_iso = started.astimezone(dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    assert f'<time datetime="{start_iso}"' in html
    svg = svgs(html, "refresh-timeline")
    spans = rects(svg, "chart-span")
    assert [title(s) for s in spans] == [
        "Close gate attempt 1: ok · 5.0 s",
        "Pause attempt 1: ok · 15.0 s",
        "Update weights attempt 1: failed · 10.0 s",
        "Update weights attempt 2: ok · 30.0 s",
    ]
    lanes = [t.text for t in svg.iter(f"{SVG}text") if t.get("class") == "chart-label"]
    assert lanes == ["Close gate", "Pause", "Update weights"]
    # the retry sits right of the failure on the same lane
    assert float(spans[3].get("x")) > float(spans[2].get("x"))
    assert spans[2].get("y") == spans[3].get("y")


def test_fleet_map_legend_names_every_version_and_erroring(viewer_client, source):
    make_fleet(source, 12)
    html = viewer_client.get(
        reverse("fleet:source_map", args=[source.pk]), headers={"HX-Request": "true"}
    ).content.decode()
    legend = html[html.index('<ul class="fleet-map-legend">') :]
    names = re.findall(r'<span class="chart-swatch ([\w-]+)"></span> ([^<]+)</li>', legend)
    assert names == [
        ("chart-v0", "step-0"),
        ("chart-v1", "step-1"),
        ("chart-v2", "step-2"),
        ("chart-erroring", "erroring"),
    ]
