"""The charts' axis note says what was drawn: no data is "no data", never the scale's 1 ms."""

from controlplane import charts


def test_an_empty_chart_says_no_data():
    for drawn in (charts.sparkline([], label="durations"), charts.bars([], label="durations")):
        assert ">no data</text>" in drawn
        assert "max 1 ms" not in drawn


def test_the_axis_note_is_the_largest_value():
    drawn = charts.sparkline([("a", 0.0), ("b", 0.0)], label="durations")
    assert ">max 0 ms</text>" in drawn and "max 1 ms" not in drawn
    drawn = charts.bars(
        [charts.Bar("a", 1500.0, "ok", "a"), charts.Bar("b", 250.0, "ok", "b")], label="x"
    )
    assert f">max {charts.format_ms(1500.0)}</text>" in drawn


def _span(label: str) -> charts.Span:
    import datetime as dt

    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    return charts.Span(label, start, start + dt.timedelta(seconds=1), "ok", label)


def _gutter_and_texts(svg: str) -> tuple[float, list[str]]:
    import re

    labels = re.findall(r'<text class="chart-label" x="([\d.]+)"[^>]*>([^<]*)<title>', svg)
    return float(labels[0][0]), [text for _, text in labels]


def test_gantt_labels_fit_their_gutter_instead_of_being_cut_on_the_left():
    import datetime as dt

    long = "resuming engines · wave 12 of 12"
    svg = charts.gantt([_span("gate"), _span(long)], label="x", now=dt.datetime.now(dt.UTC))
    x, texts = _gutter_and_texts(svg)
    assert texts == ["gate", long]  # the gutter grew to hold the whole label
    assert x >= len(long) * charts.LABEL_CHAR_PX
    huge = "n" * 400
    svg = charts.gantt([_span(huge)], label="x", now=dt.datetime.now(dt.UTC), width=640)
    x, (text,) = _gutter_and_texts(svg)
    assert x <= 640 * 0.45 and len(text) * charts.LABEL_CHAR_PX <= x and "…" in text
    assert f"<title>{huge}</title>" in svg  # the whole label on hover


def test_worker_lanes_keep_the_namespace_and_the_instance_id():
    from controlplane.refresh.charts import _lane

    assert _lane("rl-a/backend/rl/4247597587064290621") == "rl-a/…/4247597587064290621"
    assert _lane("rl-a/b/g/7") == "rl-a/b/g/7"
    assert _lane("a-very-long-namespace-name/backend/rl/4247597587064290621").startswith("a-very")
