"""The source page's serving health charts load after the page and follow new points on
their own poll, with a clean console (CSP included: no inline script or style)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.audit.recorder import Actor
from controlplane.fleet import services
from controlplane.fleet.models import ServingHealthPoint
from tests.conftest import PASSWORD
from tests.fixtures.live_server import sign_in

pytestmark = pytest.mark.browser


def _point(source, seconds_ago: float, rate: float) -> ServingHealthPoint:
    return ServingHealthPoint.objects.create(
        source=source,
        taken_at=timezone.now() - timedelta(seconds=seconds_ago),
        seconds=5.0,
        request_rate=rate,
        error_rate=0.0,
        error_ratio=0.0,
        ttft_p50_ms=30.0,
        ttft_p90_ms=80.0,
        by_model={
            "<b>policy</b>": {
                "request_rate": rate,
                "error_rate": 0.0,
                "error_ratio": 0.0,
                "ttft_p50_ms": 30.0,
                "ttft_p90_ms": 80.0,
            }
        },
    )


def test_serving_health_loads_and_follows_new_points(page, viewer):
    source = services.create_source(
        actor=Actor.system("test"),
        name="served",
        listener_url="http://127.0.0.1:1",
        frontend_url="http://127.0.0.1:2",
        allowed_networks=["127.0.0.0/8"],
        expected_prefix="rl",
    )
    for i in range(4):
        _point(source, 20 - 5 * i, 3.0 + i)
    problems: list[str] = []
    page.on(
        "console",
        lambda m: m.type in ("error", "warning") and problems.append(f"{m.type}: {m.text}"),
    )
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("response", lambda r: r.status >= 400 and problems.append(f"HTTP {r.status}: {r.url}"))

    sign_in(page, viewer.username, PASSWORD)
    page.goto(f"/sources/{source.pk}/")
    page.wait_for_selector("#serving-health[data-points='4']")
    assert page.locator("#serving-health svg.chart").count() == 3
    assert page.inner_text("#serving-request-rate") == "6/s"
    assert page.inner_text("#serving-models code") == "<b>policy</b>"  # shown as text

    _point(source, 0, 42.0)  # what the next sample would write
    page.wait_for_selector("#serving-health[data-points='5']", timeout=20_000)
    assert page.inner_text("#serving-request-rate") == "42/s"
    assert page.locator("#serving-health svg.chart").count() == 3
    assert problems == []
