"""Serving health against the simulated fleet's frontend, which serves the real 1.6.1 metric
names on `/metrics` (controlplane/simfleet/servers/frontend.py): traffic sent through it must
show up in one point, exactly."""

from __future__ import annotations

import httpx
import pytest

from controlplane.fleet import serving_health
from controlplane.fleet.models import ServingHealthPoint

PROMPT = [5, 6, 7, 8]


def _completion(url: str, model: str, *, stream: bool = False) -> int:
    body = {"model": model, "prompt": PROMPT, "max_tokens": 3, "stream": stream}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=10).status_code


def test_a_window_of_simulated_traffic_becomes_one_point(simfleet, make_source):
    assert httpx.get(f"{simfleet.frontend_url}/metrics", timeout=10).status_code == 200
    source = make_source(simfleet)
    serving_health.sample_all()  # the baseline

    codes = [_completion(simfleet.frontend_url, "sim-model") for _ in range(3)]
    codes.append(_completion(simfleet.frontend_url, "sim-model", stream=True))
    codes.append(_completion(simfleet.frontend_url, "no-such-model"))
    assert codes == [200, 200, 200, 200, 404]
    # Like the real one, the frontend has request series only once it served a request.
    assert "dynamo_frontend_requests_total{" in httpx.get(f"{simfleet.frontend_url}/metrics").text
    serving_health.sample_all()

    (point,) = ServingHealthPoint.objects.filter(source=source)
    assert point.error == ""
    assert point.request_rate * point.seconds == pytest.approx(5)
    assert point.error_rate * point.seconds == pytest.approx(1)
    assert point.error_ratio == pytest.approx(1 / 5)
    assert point.ttft_p50_ms is not None and point.ttft_p90_ms >= point.ttft_p50_ms
    assert point.by_model["sim-model"]["request_rate"] * point.seconds == pytest.approx(4)
