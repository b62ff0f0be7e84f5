"""The one way a moment is shown: UTC with the zone written, ISO in `datetime`, localised by JS."""

import datetime as dt
from xml.etree import ElementTree

from controlplane.fleet.templatetags.timefmt import duration, elapsed, moment


def test_moment_renders_utc_with_zone_and_iso_datetime():
    when = dt.datetime(2026, 11, 30, 21, 5, 9, tzinfo=dt.timezone(dt.timedelta(hours=-2)))
    node = ElementTree.fromstring(moment(when))
    assert node.tag == "time"
    assert node.get("datetime") == "2026-11-30T23:05:09Z"
    assert node.get("title") == "2026-11-30 23:05:09 UTC"
    assert node.get("data-local") == "full"
    assert node.text == "2026-11-30 23:05:09 UTC"


def test_moment_clock_only_keeps_full_date_in_title():
    node = ElementTree.fromstring(moment(dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC), "time"))
    assert node.text == "03:04:05 UTC"
    assert node.get("title") == "2026-01-02 03:04:05 UTC"
    assert node.get("data-local") == "time"


def test_moment_of_nothing_is_empty():
    assert moment(None) == ""


def test_durations_read_like_a_clock():
    assert duration(0.25) == "250 ms"
    assert duration(3.21) == "3.2 s"
    assert duration(dt.timedelta(seconds=184)) == "3 min 04 s"
    assert duration(3600 * 2 + 120) == "2 h 02 min"
    assert duration("x") == ""
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    assert elapsed(start, start + dt.timedelta(seconds=61)) == "1 min 01 s"
