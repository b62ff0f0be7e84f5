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
