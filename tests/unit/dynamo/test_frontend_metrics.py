"""Prometheus metrics of the Dynamo frontend and a worker's system server
(`dynamo/frontend_metrics.py`), read from expositions captured from real Dynamo 1.6.1
(tests/fixtures/dynamo/*.txt) and from hostile ones."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from aiohttp import web

from controlplane.dynamo.frontend_metrics import (
    MAX_METRICS_BYTES,
    FrontendSnapshot,
    Histogram,
    MetricsError,
    fetch_frontend_snapshot,
    fetch_worker_snapshot,
    parse_frontend_metrics,
    parse_worker_metrics,
    serving_delta,
    worker_delta,
)
from controlplane.dynamo.policy import OutboundPolicy

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "dynamo"
IDLE = (FIXTURES / "frontend-metrics-1.6.1-idle.txt").read_text()
BUSY = (FIXTURES / "frontend-metrics-1.6.1.txt").read_text()
WORKER = (FIXTURES / "worker-system-metrics-1.6.1.txt").read_text()
REPLICAS = ("10029315292885286686", "17640440873707535865")
INF = math.inf


# -- the captured 1.6.1 expositions --------------------------------------------------------------


def test_an_idle_frontend_has_no_request_series():
    snapshot = parse_frontend_metrics(IDLE, taken_at=0)
    assert snapshot.models == {} and snapshot.workers == {} and snapshot.problems == ()


def test_the_busy_frontend_counts_requests_and_errors_per_model():
    snapshot = parse_frontend_metrics(BUSY, taken_at=1)
    assert set(snapshot.models) == {"tiny-policy", "unknown_model"}
    policy = snapshot.models["tiny-policy"]
    # 5 unary + 3 streamed successes, 3 refused as `validation` (unroutable pin, bad token).
    assert policy.requests == 11 and policy.errors == 3
    assert policy.errors_by_type == {"validation": 3}
    assert policy.inflight == 0
    assert policy.ttft is not None and policy.ttft.count == 8
    assert policy.ttft.bounds[:3] == (0.0, 0.0022, 0.0047) and policy.ttft.bounds[-1] == INF
    assert policy.duration is not None and policy.duration.count == 11
    assert policy.duration.bounds == (0, 2, 4, 8, 16, 32, 64, 130, 260, 510, INF)
    # A request for a model the frontend does not serve is counted under "unknown_model".
    assert snapshot.models["unknown_model"].errors_by_type == {"not_found": 2}
    assert snapshot.problems == ()


def test_the_frontend_keeps_only_last_latencies_per_worker():
    workers = parse_frontend_metrics(BUSY, taken_at=1).workers
    assert set(workers) == set(REPLICAS)
    assert workers[REPLICAS[0]].last_ttft_s == pytest.approx(0.002615149)
    assert workers[REPLICAS[1]].last_itl_s is None  # it generated a single token


def test_a_window_between_the_captures_gives_rates_ratios_and_quantiles():
    before = parse_frontend_metrics(IDLE, taken_at=100)
    after = parse_frontend_metrics(BUSY, taken_at=110)
    delta = serving_delta(before, after)["tiny-policy"]
    assert delta.seconds == 10 and delta.requests == 11 and delta.errors == 3
    assert delta.request_rate == pytest.approx(1.1)
    assert delta.error_rate == pytest.approx(0.3)
    assert delta.error_ratio == pytest.approx(3 / 11)
    # Buckets (le): 0.0022 -> 3, 0.0047 -> 5, 0.01 -> 8 of 8 observations.
    assert delta.ttft_ms[0.5] == pytest.approx((0.0022 + (0.0047 - 0.0022) * (4 - 3) / 2) * 1000)
    assert delta.ttft_ms[0.99] == pytest.approx((0.0047 + 0.0053 * (7.92 - 5) / 3) * 1000)
    # Duration buckets are 2 s wide at the bottom: 11 requests in (0, 2].
    assert delta.duration_ms[0.5] == pytest.approx(1000)
    assert not delta.reset


def test_a_window_without_traffic_has_no_ratio_or_quantiles():
    same = parse_frontend_metrics(BUSY, taken_at=1)
    later = parse_frontend_metrics(BUSY, taken_at=31)
    delta = serving_delta(same, later)["tiny-policy"]
    assert delta.requests == 0 and delta.error_ratio is None
    assert delta.ttft_ms == {0.5: None, 0.9: None, 0.99: None}


def test_a_restarted_frontend_counts_from_its_restart():
    busy = parse_frontend_metrics(BUSY, taken_at=1)
    fewer = BUSY.replace(
        'request_type="unary",status="success"} 5', 'request_type="unary",status="success"} 1'
    ).replace(
        'error_type="validation",model="tiny-policy",request_type="unary",status="error"} 2',
        'error_type="validation",model="tiny-policy",request_type="unary",status="error"} 0',
    )
    restarted = parse_frontend_metrics(fewer, taken_at=2)
    delta = serving_delta(busy, restarted)["tiny-policy"]
    # After the restart: 3 + 1 successes and 1 + 0 errors, all of them in the window.
    assert delta.reset and delta.requests == 5 and delta.errors == 1


def test_snapshots_out_of_order_are_refused():
    a = parse_frontend_metrics(BUSY, taken_at=5)
    with pytest.raises(ValueError, match="after"):
        serving_delta(a, a)


def test_the_worker_system_server_counts_its_generate_endpoint():
    snapshot = parse_worker_metrics(WORKER, taken_at=0)
    # The series are labelled with the instance id in hex (f4cf6f82f69e7df9).
    counters = snapshot.workers[int(REPLICAS[1])]
    assert counters.requests == 1 and counters.errors == 0 and counters.cancellations == 0
    assert counters.duration is not None and counters.duration.count == 1
    # The listener's probe endpoint is counted apart, with the error 1.6.1 recorded there.
    probe = parse_worker_metrics(WORKER, taken_at=0, endpoint="rl").workers[int(REPLICAS[1])]
    assert probe.requests == 2 and probe.errors == 1


def test_a_worker_window_gives_its_error_ratio():
    before = parse_worker_metrics(WORKER, taken_at=0)
    more = WORKER.replace(
        'dynamo_endpoint="generate",dynamo_namespace="dynamo",worker_id="f4cf6f82f69e7df9"} 1',
        'dynamo_endpoint="generate",dynamo_namespace="dynamo",worker_id="f4cf6f82f69e7df9"} 11',
    )
    more += (
        'dynamo_component_errors_total{dynamo_component="backend",dynamo_endpoint="generate",'
        'dynamo_namespace="dynamo",error_type="generate",worker_id="f4cf6f82f69e7df9"} 4\n'
    )
    after = parse_worker_metrics(more, taken_at=20)
    delta = worker_delta(before, after)[int(REPLICAS[1])]
    assert delta.requests == 10 and delta.errors == 4
    assert delta.error_ratio == pytest.approx(0.4) and delta.request_rate == pytest.approx(0.5)


# -- histogram arithmetic ------------------------------------------------------------------------


def hist(*pairs: tuple[float, float], total_sum: float = 0.0) -> Histogram:
    return Histogram(tuple(b for b, _ in pairs), tuple(c for _, c in pairs), total_sum)


@pytest.mark.parametrize(
    ("q", "expected"),
    [
        (0.0, 0.0),  # Prometheus: the lower edge of the first non-empty bucket
        (0.25, 0.5),
        (0.5, 1.0),
        (0.75, 1.5),
        (1.0, 2.0),
    ],
)
def test_quantiles_interpolate_inside_a_bucket(q, expected):
    h = hist((1.0, 2), (2.0, 4), (INF, 4))
    assert h.quantile(q) == pytest.approx(expected)


def test_a_quantile_in_the_overflow_bucket_is_the_highest_finite_bound():
    assert hist((1.0, 1), (2.0, 1), (INF, 10)).quantile(0.9) == 2.0


def test_an_empty_histogram_has_no_quantile_and_no_mean():
    h = hist((1.0, 0), (INF, 0))
    assert h.quantile(0.5) is None and h.mean() is None
    assert hist((1.0, 1), (INF, 2)).quantile(1.5) is None


def test_a_histogram_minus_an_earlier_one_is_the_window():
    later = hist((1.0, 5), (2.0, 9), (INF, 10), total_sum=12.0)
    earlier = hist((1.0, 5), (2.0, 5), (INF, 6), total_sum=4.0)
    window = later.minus(earlier)
    assert window.cumulative == (0, 4, 4) and window.sum == 8.0
    assert window.quantile(0.5) == pytest.approx(1.5)
    # Counts that went down: the process restarted, the later histogram is the window.
    assert earlier.minus(later) is earlier
    assert later.minus(hist((5.0, 1), (INF, 1))) is later


# -- hostile expositions --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "this is { not prometheus",
        'dynamo_frontend_requests_total{model="a" 3\n',
        'dynamo_frontend_requests_total{model="a"} three\n',
    ],
)
def test_text_that_is_not_prometheus_is_a_metrics_error(text):
    with pytest.raises(MetricsError, match="not Prometheus text"):
        parse_frontend_metrics(text, taken_at=0)


def test_oversized_or_endless_expositions_are_refused():
    with pytest.raises(MetricsError, match="over"):
        parse_frontend_metrics("#" * (MAX_METRICS_BYTES + 1), taken_at=0)
    many = "a 1\n" * 200_001
    with pytest.raises(MetricsError, match="more than 200000 samples"):
        parse_frontend_metrics(many, taken_at=0)


def test_impossible_values_are_dropped_and_named():
    text = (
        "# TYPE dynamo_frontend_requests_total counter\n"
        'dynamo_frontend_requests_total{model="a",status="success"} 5\n'
        'dynamo_frontend_requests_total{model="a",status="error",error_type="x"} -2\n'
        'dynamo_frontend_requests_total{model="b",status="success"} NaN\n'
        "# TYPE dynamo_frontend_time_to_first_token_seconds histogram\n"
        'dynamo_frontend_time_to_first_token_seconds_bucket{model="a",le="0.1"} 5\n'
        'dynamo_frontend_time_to_first_token_seconds_bucket{model="a",le="+Inf"} 3\n'
        'dynamo_frontend_time_to_first_token_seconds_count{model="a"} 3\n'
        "# TYPE dynamo_frontend_request_duration_seconds histogram\n"
        'dynamo_frontend_request_duration_seconds_bucket{model="a",le="1"} 3\n'
        'dynamo_frontend_request_duration_seconds_count{model="a"} 3\n'
    )
    snapshot = parse_frontend_metrics(text, taken_at=0)
    a = snapshot.models["a"]
    assert a.requests == 5 and a.errors == 0
    assert a.ttft is None and a.duration is None
    assert "b" not in snapshot.models
    joined = " | ".join(snapshot.problems)
    assert "'error_type': 'x'} = -2" in joined and "nan dropped" in joined
    assert "buckets that go down" in joined and "no +Inf bucket" in joined


def test_worker_series_with_a_bad_instance_label_are_skipped():
    text = (
        'dynamo_component_requests_total{dynamo_endpoint="generate",worker_id="0x12"} 3\n'
        'dynamo_component_requests_total{dynamo_endpoint="generate",worker_id="ff"} 3\n'
    )
    snapshot = parse_worker_metrics(text, taken_at=0)
    assert list(snapshot.workers) == [255]
    assert "'0x12' skipped" in snapshot.problems[0]


# -- fetching over HTTP ---------------------------------------------------------------------------


async def test_a_snapshot_is_fetched_from_the_frontend(server, client, loopback_policy):
    async def metrics(_request: web.Request) -> web.StreamResponse:
        return web.Response(text=BUSY, content_type="text/plain")

    server.route("/metrics", metrics)
    snapshot = await fetch_frontend_snapshot(
        client, server.base_url + "/", policy=loopback_policy, timeout=5, clock=lambda: 42.0
    )
    assert isinstance(snapshot, FrontendSnapshot) and snapshot.taken_at == 42.0
    assert snapshot.models["tiny-policy"].requests == 11
    worker = await fetch_worker_snapshot(
        client, server.base_url, policy=loopback_policy, timeout=5, clock=lambda: 1.0
    )
    assert worker.workers == {}  # the frontend's text has no work-handler counters


async def test_fetch_failures_are_metrics_errors(server, client, loopback_policy):
    server.json("/metrics", {"message": "nope"}, status=503)
    with pytest.raises(MetricsError, match="HTTP 503"):
        await fetch_frontend_snapshot(client, server.base_url, policy=loopback_policy, timeout=5)
    server.route("/metrics", server.hang)
    with pytest.raises(MetricsError, match=r"timed out after 0\.2s"):
        await fetch_frontend_snapshot(client, server.base_url, policy=loopback_policy, timeout=0.2)
    elsewhere = OutboundPolicy.from_cidrs(["10.0.0.0/8"])
    before = server.hits["/metrics"]
    with pytest.raises(MetricsError, match="outbound policy"):
        await fetch_frontend_snapshot(client, server.base_url, policy=elsewhere, timeout=5)
    with pytest.raises(MetricsError, match="outbound policy"):
        await fetch_worker_snapshot(client, server.base_url, policy=elsewhere, timeout=5)
    assert server.hits["/metrics"] == before


async def test_an_oversized_or_binary_exposition_is_a_metrics_error(
    server, client, loopback_policy
):
    async def huge(_request: web.Request) -> web.StreamResponse:
        return web.Response(body=b"#" * (MAX_METRICS_BYTES + 10))

    server.route("/metrics", huge)
    with pytest.raises(MetricsError, match="over"):
        await fetch_frontend_snapshot(client, server.base_url, policy=loopback_policy, timeout=5)

    async def binary(_request: web.Request) -> web.StreamResponse:
        return web.Response(body=b"\xff\xfe\x00")

    server.route("/metrics", binary)
    with pytest.raises(MetricsError, match="not UTF-8"):
        await fetch_frontend_snapshot(client, server.base_url, policy=loopback_policy, timeout=5)
