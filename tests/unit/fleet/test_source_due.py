"""`Source.is_due`: the one rule the beat tick and the refresh claim both use."""

from datetime import UTC, datetime, timedelta

import pytest

from controlplane.fleet.models import Source

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def two_second_tick(settings):
    settings.DISCOVERY_TICK_SECONDS = 2.0


def source(started_seconds_ago: float | None, interval: float = 10.0) -> Source:
    started = None if started_seconds_ago is None else NOW - timedelta(seconds=started_seconds_ago)
    return Source(discovery_interval_seconds=interval, last_discovery_started_at=started)


def test_a_source_never_refreshed_is_due():
    assert source(None).is_due(NOW)


@pytest.mark.parametrize(
    ("ago", "due"),
    [(0.0, False), (8.9, False), (9.0, True), (10.0, True), (60.0, True)],
)
def test_due_half_a_tick_before_the_interval_ends(ago, due):
    # Interval 10 s, tick 2 s: due from 9 s on, so a tick landing just short of 10 s refreshes.
    assert source(ago).is_due(NOW) is due
