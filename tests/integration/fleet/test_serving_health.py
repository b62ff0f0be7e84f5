"""Serving health: the sampler against a real HTTP server serving the captured Dynamo 1.6.1
frontend exposition (tests/fixtures/dynamo/), the ring's pruning, and the chart fragment."""

from __future__ import annotations

import re
import threading
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from django.core.cache import cache
from django.urls import reverse
from django.utils import timezone

from controlplane.audit.recorder import Actor
from controlplane.fleet import services, serving_health
from controlplane.fleet.models import ServingHealthPoint, Source
from controlplane.jsonshapes import SHAPES, problems
from tests.integration.fleet.conftest import LOOPBACK, closed_port_url, wait_for

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "dynamo"
IDLE = (FIXTURES / "frontend-metrics-1.6.1-idle.txt").read_text()
BUSY = (FIXTURES / "frontend-metrics-1.6.1.txt").read_text()
STREAM_OK = (
    'dynamo_frontend_requests_total{endpoint="completions",error_type="",model="tiny-policy",'
    'request_type="stream",status="success"}'
)
HOSTILE = '<img src=x onerror="alert(1)">&amp;'


def bumped(text: str, series: str, by: float) -> str:
    """`text` with the value of the one sample named exactly `series` raised by `by`."""
    pattern = re.compile(rf"^({re.escape(series)}) (\S+)$", re.MULTILINE)
    assert len(pattern.findall(text)) == 1, series
    return pattern.sub(lambda m: f"{m.group(1)} {float(m.group(2)) + by:g}", text)


def restarted(text: str) -> str:
    """`text` as a frontend that restarted and has served one request of each kind since:
    every requests counter back to 1."""
    return re.sub(r"^(dynamo_frontend_requests_total\{[^}]*\}) \S+$", r"\1 1", text, flags=re.M)


class Exposition:
    """A real HTTP server answering `GET /metrics` with whatever `text` holds now."""

    def __init__(self) -> None:
        self.text = IDLE
        self.hits = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner.hits += 1
                if self.path != "/metrics":
                    self.send_error(404)
                    return
                body = owner.text.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def frontend() -> Iterator[Exposition]:
    exposition = Exposition()
    yield exposition
    exposition.close()


def make(name: str, frontend_url: str, **kwargs) -> Source:
    values = {"allowed_networks": LOOPBACK, "expected_prefix": "rl", **kwargs}
    return services.create_source(
        actor=Actor.system("test"),
        name=name,
        listener_url="http://127.0.0.1:1",
        frontend_url=frontend_url,
        **values,
    )


def points(source: Source) -> list[ServingHealthPoint]:
    return list(ServingHealthPoint.objects.filter(source=source).order_by("taken_at", "id"))


def test_rates_errors_and_latency_come_from_the_window_between_two_reads(db, frontend):
    source = make("busy", frontend.url)

    assert serving_health.sample_all() == 1
    assert points(source) == []  # the first read is only the baseline

    frontend.text = BUSY
    serving_health.sample_all()
    (point,) = points(source)
    assert point.error == "" and point.seconds > 0 and not point.reset
    # Between the idle and the busy capture: tiny-policy 8 ok + 3 refused, unknown_model 2
    # refused (a 404 is counted under `unknown_model`): 13 requests, 5 errors.
    assert point.request_rate == pytest.approx(13 / point.seconds)
    assert point.error_rate == pytest.approx(5 / point.seconds)
    assert point.error_ratio == pytest.approx(5 / 13)
    # TTFT buckets of the 8 streamed tokens: 3 <= 2.2 ms, 5 <= 4.7 ms, 8 <= 10 ms. The median
    # (rank 4) is halfway through (2.2, 4.7]; p90 (rank 7.2) 11/15 of the way through (4.7, 10].
    assert point.ttft_p50_ms == pytest.approx(3.45)
    assert point.ttft_p90_ms == pytest.approx(4.7 + 5.3 * 2.2 / 3)
    # Durations: all 13 in 1.6.1's first bucket (0, 2 s].
    assert point.duration_p50_ms == pytest.approx(1000)
    assert set(point.by_model) == {"tiny-policy", "unknown_model"}
    tiny = point.by_model["tiny-policy"]
    assert tiny["request_rate"] == pytest.approx(11 / point.seconds)
    assert tiny["error_ratio"] == pytest.approx(3 / 11)
    assert point.by_model["unknown_model"]["error_ratio"] == 1.0
    stored = ServingHealthPoint.objects.get(pk=point.pk).by_model
    assert problems(stored, SHAPES["fleet.ServingHealthPoint.by_model"]) == []

    frontend.text = bumped(BUSY, STREAM_OK, 10)
    serving_health.sample_all()
    latest = points(source)[-1]
    assert latest.request_rate == pytest.approx(10 / latest.seconds)
    assert latest.error_rate == 0 and latest.error_ratio == 0
    assert latest.ttft_p50_ms is None  # the counter moved, the histogram did not: no tokens


def test_a_restarted_frontend_counts_from_its_restart(db, frontend):
    source = make("restarts", frontend.url)
    frontend.text = BUSY
    serving_health.sample_all()

    frontend.text = restarted(BUSY)
    serving_health.sample_all()

    (point,) = points(source)
    assert point.reset
    # Every counter went down: what it holds now is what happened since the restart
    # (tiny-policy 4 of which 2 errors, unknown_model 1 error), never a negative rate.
    assert point.request_rate == pytest.approx(5 / point.seconds)
    assert point.error_rate == pytest.approx(3 / point.seconds)


def test_a_frontend_that_cannot_be_read_gives_an_error_point_and_the_others_go_on(db, frontend):
    frontend.text = BUSY
    fine = make("fine", frontend.url)
    down = make("down", closed_port_url())
    outside = make("outside", frontend.url)
    # Saving refuses this; the sampler still checks every read (a name may resolve elsewhere
    # later), so the row is narrowed behind the form's back.
    Source.objects.filter(pk=outside.pk).update(allowed_networks=["10.0.0.0/8"])
    make("off", frontend.url, enabled=False)
    make("no-frontend", "")

    assert serving_health.sample_all() == 3
    frontend.text = bumped(BUSY, STREAM_OK, 1)
    assert serving_health.sample_all() == 3

    assert [p.error for p in points(fine)] == [""]
    for source, reason in ((down, "metrics unreachable"), (outside, "outbound policy")):
        errors = points(source)
        assert len(errors) == 2, source.name
        for p in errors:
            assert p.error.startswith(reason) and p.request_rate is None and p.by_model == {}
    # Only the sources read: not the disabled one nor the one without a frontend.
    assert frontend.hits == 2


def test_text_that_is_not_metrics_is_an_error_point(db, frontend):
    source = make("garbage", frontend.url)
    frontend.text = "this is { not prometheus\n"
    serving_health.sample_all()
    (point,) = points(source)
    assert point.error.startswith("not Prometheus text")


def test_a_baseline_from_another_frontend_url_is_not_subtracted(db, frontend):
    source = make("moved", frontend.url)
    frontend.text = BUSY
    serving_health.sample_all()
    other = Exposition()
    try:
        other.text = IDLE
        Source.objects.filter(pk=source.pk).update(frontend_url=other.url)
        serving_health.sample_all()
        assert points(source) == []  # a new baseline, not busy-minus-idle as a reset
    finally:
        other.close()


def test_pruning_keeps_the_ring_bounded_by_age(db, settings):
    settings.SERVING_HEALTH_KEEP_SECONDS = 3600
    source = make("ring", "")
    now = timezone.now()
    ServingHealthPoint.objects.bulk_create(
        ServingHealthPoint(source=source, taken_at=now - timedelta(minutes=m), request_rate=1.0)
        for m in (0, 30, 59, 61, 120, 24 * 60)
    )
    assert serving_health.prune(now) == 3
    kept = sorted(round((now - p.taken_at).total_seconds() / 60) for p in points(source))
    assert kept == [0, 30, 59]


def test_the_task_prunes_on_every_tick(db, settings, frontend):
    settings.SERVING_HEALTH_KEEP_SECONDS = 60
    source = make("tick", frontend.url)
    ServingHealthPoint.objects.create(
        source=source, taken_at=timezone.now() - timedelta(minutes=5), error="old"
    )
    from controlplane.fleet.tasks import sample_serving_health

    assert sample_serving_health() == 1
    assert points(source) == []


def test_the_baseline_expires_after_a_gap(db, frontend):
    source = make("gap", frontend.url)
    serving_health.sample_all()
    cache.delete(serving_health.baseline_key(source.pk, frontend.url))  # as if beat stopped
    frontend.text = BUSY
    serving_health.sample_all()
    assert points(source) == []


# -- the fragment ---------------------------------------------------------------------------------


def _url(source: Source) -> str:
    return reverse("fleet:serving_health", args=[source.pk])


@pytest.fixture
def charted(db):
    source = make("charted", "http://127.0.0.1:9")
    now = timezone.now()
    for i in range(6):
        ServingHealthPoint.objects.create(
            source=source,
            taken_at=now - timedelta(seconds=5 * (6 - i)),
            seconds=5.0,
            request_rate=2.0 + i,
            error_rate=0.25 * i,
            error_ratio=0.25 * i / (2.0 + i),
            ttft_p50_ms=40.0 + i,
            ttft_p90_ms=90.0 + i,
            duration_p50_ms=1000.0,
            duration_p90_ms=1800.0,
            by_model={
                HOSTILE: {
                    "request_rate": 1.5,
                    "error_rate": 0.0,
                    "error_ratio": 0.0,
                    "ttft_p50_ms": 40.0,
                    "ttft_p90_ms": 90.0,
                }
            },
        )
    # Older than the window: never drawn.
    ServingHealthPoint.objects.create(
        source=source, taken_at=now - timedelta(hours=1), seconds=5.0, request_rate=999.0
    )
    return source


def test_anonymous_is_sent_to_login(client, charted):
    response = client.get(_url(charted))
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


def test_the_fragment_draws_the_window_and_the_latest_numbers(viewer_client, charted):
    response = viewer_client.get(_url(charted))
    assert response.status_code == 200
    html = response.content.decode()
    assert 'hx-trigger="every 5s"' in html and "last 15 min" in html
    assert 'id="serving-request-rate">7/s' in html  # the newest point: 2 + 5
    assert "1.25/s" in html and "(18% of requests)" in html
    assert "p50 45 ms" in html and "p90 95 ms" in html
    for chart_id, lines in (("serving-requests", 1), ("serving-errors", 1), ("serving-latency", 2)):
        figure = re.search(rf'<figure[^>]*id="{chart_id}".*?</figure>', html, re.S)
        assert figure, chart_id
        svg = ET.fromstring(re.search(r"<svg.*</svg>", figure.group(0), re.S).group(0))
        ns = "{http://www.w3.org/2000/svg}"
        assert len(svg.findall(f"{ns}polyline")) == lines, chart_id
        assert len(svg.findall(f"{ns}circle")) == 6 * lines, chart_id  # the hour-old one is out
    assert "max 7/s" in html and "999/s" not in html


def test_hostile_model_names_are_escaped(viewer_client, charted):
    html = viewer_client.get(_url(charted)).content.decode()
    assert HOSTILE not in html and "<img" not in html
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;&amp;amp;" in html


def test_an_unreadable_frontend_is_said_at_once(viewer_client, charted):
    ServingHealthPoint.objects.create(
        source=charted, taken_at=timezone.now(), error="metrics unreachable: <refused>"
    )
    html = viewer_client.get(_url(charted)).content.decode()
    assert 'role="alert" id="serving-health-error"' in html
    assert "cannot be read now" in html and "metrics unreachable: &lt;refused&gt;" in html


def test_a_source_without_a_frontend_does_not_poll(viewer_client, db):
    source = make("plain", "")
    html = viewer_client.get(_url(source)).content.decode()
    assert "no frontend URL" in html and "hx-trigger" not in html


def test_the_source_page_loads_the_fragment(viewer_client, charted):
    html = viewer_client.get(reverse("fleet:source", args=[charted.pk])).content.decode()
    assert f'hx-get="{_url(charted)}" hx-trigger="load"' in html


def test_an_unknown_source_is_404(viewer_client, db):
    assert viewer_client.get(reverse("fleet:serving_health", args=[999_999])).status_code == 404


@pytest.mark.celery
def test_the_beat_task_runs_on_a_celery_worker(celery_worker, db, frontend):
    from controlplane.fleet.tasks import sample_serving_health

    source = make("celery", frontend.url)
    sample_serving_health.delay()
    wait_for(lambda: frontend.hits == 1)
    frontend.text = BUSY
    sample_serving_health.delay()
    point = wait_for(lambda: ServingHealthPoint.objects.filter(source=source).first())
    assert point.request_rate == pytest.approx(13 / point.seconds)


def test_a_long_window_draws_the_worst_of_each_stretch(viewer_client, db):
    source = make("long", "http://127.0.0.1:9")
    now = timezone.now()
    ServingHealthPoint.objects.bulk_create(
        ServingHealthPoint(
            source=source,
            taken_at=now - timedelta(seconds=2 * (400 - i)),
            seconds=2.0,
            request_rate=500.0 if i == 201 else 1.0,
            error_rate=0.0,
        )
        for i in range(400)
    )
    html = viewer_client.get(_url(source)).content.decode()
    figure = re.search(r'<figure[^>]*id="serving-requests".*?</figure>', html, re.S).group(0)
    svg = ET.fromstring(re.search(r"<svg.*</svg>", figure, re.S).group(0))
    dots = svg.findall("{http://www.w3.org/2000/svg}circle")
    assert len(dots) <= serving_health.MAX_DRAWN
    assert (
        sum("500/s" in (d.findtext("{http://www.w3.org/2000/svg}title") or "") for d in dots) == 1
    )
    assert "max 500/s" in figure
