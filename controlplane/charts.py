"""Charts as server-rendered SVG: stacked bars, bars, a sparkline and a Gantt.

Why SVG from Python and no JavaScript charting library: the pages run under a strict CSP
(`script-src 'self'`, no inline styles), so SVG elements styled by CSS classes in app.css need
no exception, nothing to vendor or pin, and they render without JavaScript, in live htmx swaps
(a fragment re-rendered server-side carries its chart) and in tests, which parse the markup
with xml.etree and count elements. The charts here are small (a few hundred elements), which
SVG handles well. The fleet map is not here: one element per worker was megabytes of markup at
10,000 workers, so it is a compact payload drawn on a canvas by a static script
(`controlplane/fleet/charts.py` `FleetMap`, static/js/fleet_map.js).

Every text that reaches a chart (versions, namespaces, worker keys) is data from outside: it is
escaped here, attribute and text alike, and the builders return `SafeString` only for markup
they assembled themselves. Colours are CSS classes (`chart-v0` … `chart-v7` for series,
`chart-<state>` for states) so light and dark mode are a stylesheet concern.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from django.utils.html import escape
from django.utils.safestring import SafeString

#: Distinct series colours before they repeat; the legend always names each one.
PALETTE = 8


def series_class(index: int) -> str:
    return f"chart-v{index % PALETTE}"


def _num(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".")


def _svg(width: float, height: float, label: str, body: list[str], cls: str) -> SafeString:
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart {escape(cls)}" role="img" '
        f'viewBox="0 0 {_num(width)} {_num(height)}" width="{_num(width)}" '
        f'height="{_num(height)}" aria-label="{escape(label)}">'
    )
    return SafeString(head + "".join(body) + "</svg>")


@dataclass(frozen=True, slots=True)
class Segment:
    label: str
    value: float
    cls: str


@dataclass(frozen=True, slots=True)
class StackedRow:
    label: str
    segments: Sequence[Segment]


def stacked_bars(rows: Sequence[StackedRow], *, label: str, width: int = 640) -> SafeString:
    """One horizontal bar per row, split into segments proportional to each row's total,
    with the row label on the left, the total on the right and a legend below."""
    gutter, right, bar_h, gap = 160, 56, 18, 8
    span = width - gutter - right
    body: list[str] = []
    y = 0
    for row in rows:
        total = sum(s.value for s in row.segments) or 1
        body.append(
            f'<text class="chart-label" x="{gutter - 6}" y="{y + 13}" text-anchor="end">'
            f"{escape(row.label)}</text>"
        )
        x = float(gutter)
        for seg in row.segments:
            w = span * seg.value / total
            pct = 100 * seg.value / total
            body.append(
                f'<rect class="chart-bar {escape(seg.cls)}" x="{_num(x)}" y="{y}" '
                f'width="{_num(max(w, 0.5))}" height="{bar_h}"><title>{escape(row.label)}: '
                f"{escape(seg.label)}: {_num(seg.value)} ({pct:.0f}%)</title></rect>"
            )
            x += w
        body.append(
            f'<text class="chart-value" x="{gutter + span + 6}" y="{y + 13}">'
            f"{_num(sum(s.value for s in row.segments))}</text>"
        )
        y += bar_h + gap
    legend: dict[str, str] = {}
    for row in rows:
        for seg in row.segments:
            legend.setdefault(seg.label, seg.cls)
    ly = _legend(body, legend, y + 4, width)
    return _svg(width, ly + 18, label, body, "chart-stacked")


def _legend(body: list[str], legend: dict[str, str], top: float, width: float) -> float:
    """Swatch and name per series, wrapping at `width`; returns the last line's y."""
    lx, ly = 0.0, top
    for name, cls in legend.items():
        shown = name if len(name) <= 40 else name[:39] + "…"
        step = 22 + 7 * len(shown)
        if lx + step > width and lx > 0:
            lx, ly = 0.0, ly + 18
        body.append(
            f'<g class="chart-legend"><rect class="{escape(cls)}" x="{_num(lx)}" y="{ly}" '
            f'width="12" height="12"/><text x="{_num(lx + 16)}" y="{ly + 10}">'
            f"{escape(shown)}</text></g>"
        )
        lx += step
    return ly


@dataclass(frozen=True, slots=True)
class Bar:
    label: str
    value: float
    cls: str
    title: str
    href: str = ""


def _axis_note(values: Sequence[float]) -> str:
    """The largest value, as drawn: "no data" with none (not the scale's stand-in of 1 ms)."""
    text = f"max {format_ms(max(values))}" if values else "no data"
    return f'<text class="chart-axis" x="0" y="10">{escape(text)}</text>'


def bars(items: Sequence[Bar], *, label: str, height: int = 80, bar_w: int = 16) -> SafeString:
    """Vertical bars on a shared scale (oldest left), with the largest value as the axis note."""
    top = max((b.value for b in items), default=0) or 1
    gap, pad = 4, 14
    body = [_axis_note([b.value for b in items])]
    for i, b in enumerate(items):
        h = max(1.0, (height - pad) * b.value / top)
        rect = (
            f'<rect class="chart-bar {escape(b.cls)}" x="{i * (bar_w + gap)}" '
            f'y="{_num(height - h)}" width="{bar_w}" height="{_num(h)}">'
            f"<title>{escape(b.title)}</title></rect>"
        )
        body.append(f'<a href="{escape(b.href)}">{rect}</a>' if b.href else rect)
    width = max(len(items) * (bar_w + gap), 80)
    return _svg(width, height, label, body, "chart-bars")


def sparkline(points: Sequence[tuple[str, float]], *, label: str, width: int = 240) -> SafeString:
    """A line through `(title, value)` points, oldest first; each point a dot with its title."""
    height, pad, head = 60, 4, 16  # `head`: room for the axis note above the line
    top = max((v for _, v in points), default=0) or 1
    step = (width - 2 * pad) / max(1, len(points) - 1)
    coords = [
        (pad + i * step, height - pad - (height - pad - head) * v / top)
        for i, (_, v) in enumerate(points)
    ]
    body = [_axis_note([v for _, v in points])]
    if len(coords) > 1:
        path = " ".join(f"{_num(x)},{_num(y)}" for x, y in coords)
        body.append(f'<polyline class="chart-line" points="{path}"/>')
    for (title, _), (x, y) in zip(points, coords, strict=True):
        body.append(
            f'<circle class="chart-dot" cx="{_num(x)}" cy="{_num(y)}" r="2.5">'
            f"<title>{escape(title)}</title></circle>"
        )
    return _svg(width, height, label, body, "chart-spark")


@dataclass(frozen=True, slots=True)
class Line:
    """One series of `lines`: `(title, value)` points, oldest first; `cls` its colour."""

    label: str
    cls: str
    points: Sequence[tuple[str, float]]


def lines(
    series: Sequence[Line],
    *,
    label: str,
    unit: Callable[[float], str] | None = None,
    width: int = 240,
) -> SafeString:
    """Sparklines of several series on one scale (points evenly spaced, as `sparkline`), the
    largest value as the axis note in `unit` (default milliseconds), and a legend when there is
    more than one."""
    unit = unit or format_ms
    height, pad, head = 60, 4, 16
    values = [v for s in series for _, v in s.points]
    top = max(values, default=0) or 1
    note = f"max {unit(max(values))}" if values else "no data"
    body = [f'<text class="chart-axis" x="0" y="10">{escape(note)}</text>']
    if len(series) > 1:
        names = " · ".join(s.label for s in series)
        body.append(
            f'<text class="chart-axis" x="{width}" y="10" text-anchor="end">{escape(names)}</text>'
        )
    for s in series:
        step = (width - 2 * pad) / max(1, len(s.points) - 1)
        coords = [
            (pad + i * step, height - pad - (height - pad - head) * v / top)
            for i, (_, v) in enumerate(s.points)
        ]
        cls = escape(s.cls)
        if len(coords) > 1:
            path = " ".join(f"{_num(x)},{_num(y)}" for x, y in coords)
            body.append(f'<polyline class="chart-line chart-series {cls}" points="{path}"/>')
        for (title, _), (x, y) in zip(s.points, coords, strict=True):
            body.append(
                f'<circle class="chart-dot {cls}" cx="{_num(x)}" cy="{_num(y)}" r="2">'
                f"<title>{escape(s.label)} {escape(title)}</title></circle>"
            )
    return _svg(width, height, label, body, "chart-spark")


@dataclass(frozen=True, slots=True)
class Span:
    label: str
    start: dt.datetime
    end: dt.datetime | None  # None: still running, drawn up to `now`
    cls: str
    title: str


#: A generous width of one label character at the charts' 11 px font (digits and most lower
#: case letters are narrower), so a label given this much room is never cut.
LABEL_CHAR_PX = 6.8


def middle_cut(text: str, fits: int) -> str:
    """`text` in at most `fits` characters: its beginning and its end around "…"."""
    if len(text) <= fits:
        return text
    head = (fits - 1) // 2
    return text[:head] + "…" + text[len(text) - (fits - 1 - head) :]


def gantt(
    spans: Sequence[Span], *, label: str, now: dt.datetime, width: int = 640, gutter: int = 120
) -> SafeString:
    """One lane per span label (in first-seen order), each span a bar on a shared time axis;
    `gutter` is the room for the lane labels on the left."""
    lane_h = 20
    lanes: list[str] = []
    for s in spans:
        if s.label not in lanes:
            lanes.append(s.label)
    if not spans:
        return _svg(width, lane_h, label, [], "chart-gantt")
    t0 = min(s.start for s in spans)
    t1 = max((s.end or now) for s in spans)
    total = max((t1 - t0).total_seconds(), 0.001)
    # Labels end at the gutter: a gutter too narrow for one cuts it off on the left, where
    # a worker key's namespace is. Widen it to the longest label (up to 45% of the chart);
    # beyond that a label keeps its beginning and end, and the whole of it is its title.
    longest = max(len(lane) for lane in lanes)
    gutter = max(gutter, min(round(longest * LABEL_CHAR_PX) + 12, int(width * 0.45)))
    fits = max(8, int((gutter - 12) / LABEL_CHAR_PX))
    span_w = width - gutter - 8
    body: list[str] = []
    for i, lane in enumerate(lanes):
        body.append(
            f'<text class="chart-label" x="{gutter - 6}" y="{i * lane_h + 14}" '
            f'text-anchor="end">{escape(middle_cut(lane, fits))}<title>{escape(lane)}</title>'
            "</text>"
        )
    for s in spans:
        row = lanes.index(s.label)
        x = gutter + span_w * (s.start - t0).total_seconds() / total
        w = span_w * ((s.end or now) - s.start).total_seconds() / total
        body.append(
            f'<rect class="chart-span {escape(s.cls)}" x="{_num(x)}" y="{row * lane_h + 3}" '
            f'width="{_num(max(w, 1.5))}" height="{lane_h - 6}"><title>{escape(s.title)}'
            "</title></rect>"
        )
    axis_y = len(lanes) * lane_h + 12
    body.append(f'<text class="chart-axis" x="{gutter}" y="{axis_y}">0</text>')
    body.append(
        f'<text class="chart-axis" x="{width - 8}" y="{axis_y}" text-anchor="end">'
        f"{escape(format_ms(total * 1000))}</text>"
    )
    return _svg(width, axis_y + 4, label, body, "chart-gantt")


def format_ms(ms: float) -> str:
    if ms < 1000:
        return f"{ms:.0f} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    return f"{ms / 60_000:.1f} min"


@dataclass(frozen=True, slots=True)
class Layer:
    """One series of a step chart: `values[i]` holds from `times[i]` to the next time."""

    label: str
    cls: str
    values: Sequence[float]


def step_areas(
    times: Sequence[float],
    layers: Sequence[Layer],
    *,
    span: float,
    top: float,
    label: str,
    line: Layer | None = None,
    width: int = 640,
    height: int = 150,
) -> SafeString:
    """Stacked step areas over time (seconds from 0 to `span`), first layer at the bottom, on a
    0…`top` scale; `line` is drawn as an unstacked step line over them (a subset, such as the
    part admitted). Each value holds until the next time, the last one until `span`."""
    left, right, pad_top = 36, 8, 6
    plot_w, plot_h = width - left - right, height - pad_top
    scale_t = plot_w / (span or 1)
    scale_v = plot_h / (top or 1)
    xs = [left + min(t, span) * scale_t for t in times] + [left + plot_w]

    def y(value: float) -> float:
        return pad_top + plot_h - value * scale_v

    def edge(values: Sequence[float]) -> str:
        parts = [f"{_num(xs[0])},{_num(y(values[0]))}"]
        for j in range(1, len(values)):
            parts.append(f"H{_num(xs[j])}V{_num(y(values[j]))}")
        return "".join(parts) + f"H{_num(xs[-1])}"

    body: list[str] = []
    base = [0.0] * len(times)
    for layer in layers:
        stacked = [b + v for b, v in zip(base, layer.values, strict=True)]
        if times and any(layer.values):
            # The top edge left to right, then the layer below it right to left.
            back = "".join(
                f"V{_num(y(base[j]))}H{_num(xs[j])}" for j in range(len(times) - 1, -1, -1)
            )
            body.append(
                f'<path class="chart-area {escape(layer.cls)}" d="M{edge(stacked)}{back}Z">'
                f"<title>{escape(layer.label)}</title></path>"
            )
        base = stacked
    if line is not None and times:
        body.append(
            f'<path class="chart-step {escape(line.cls)}" d="M{edge(line.values)}">'
            f"<title>{escape(line.label)}</title></path>"
        )
    body.append(f'<text class="chart-axis" x="{left - 4}" y="{pad_top + 8}" text-anchor="end">')
    body.append(f"{_num(top)}</text>")
    body.append(
        f'<text class="chart-axis" x="{left - 4}" y="{pad_top + plot_h}" text-anchor="end">0</text>'
    )
    axis_y = height + 12
    body.append(f'<text class="chart-axis" x="{left}" y="{axis_y}">0</text>')
    body.append(
        f'<text class="chart-axis" x="{width - right}" y="{axis_y}" text-anchor="end">'
        f"{escape(format_ms(span * 1000))}</text>"
    )
    legend = {layer.label: layer.cls for layer in layers}
    if line is not None:
        legend[line.label] = f"{line.cls}-key"
    ly = _legend(body, legend, axis_y + 8, width)
    return _svg(width, ly + 18, label, body, "chart-steps")


def cohort_strips(
    baseline: Sequence[float], canary: Sequence[float], *, label: str, width: int = 360
) -> SafeString:
    """Two cohorts' per-prompt values on one axis: a strip of dots each (baseline above,
    canary below) with each cohort's median as a tick, and the axis' ends as numbers. The
    shape of both distributions shows at a glance, which a table of medians hides."""
    values = [*baseline, *canary]
    height, pad, lane = 64, 8, 22
    if not values:
        return _svg(
            width,
            20,
            label,
            ['<text class="chart-axis" x="0" y="12">no data</text>'],
            "chart-strips",
        )
    low, high = min(values), max(values)
    span = (high - low) or 1.0

    def x(v: float) -> float:
        return pad + (width - 2 * pad) * (v - low) / span

    body = [
        f'<text class="chart-axis" x="0" y="{height - 1}">{escape(f"{low:.4g}")}</text>',
        f'<text class="chart-axis" x="{width}" y="{height - 1}" text-anchor="end">'
        f"{escape(f'{high:.4g}')}</text>",
    ]
    for row, (name, series, cls) in enumerate(
        (("baseline", baseline, series_class(0)), ("canary", canary, series_class(1)))
    ):
        y = 10 + row * lane
        for v in series:
            body.append(
                f'<circle class="chart-dot {cls}" cx="{_num(x(v))}" cy="{y}" r="2.5">'
                f"<title>{escape(name)}: {escape(f'{v:.4g}')}</title></circle>"
            )
        if series:
            mid = sorted(series)[len(series) // 2]
            body.append(
                f'<line class="chart-median {cls}" x1="{_num(x(mid))}" x2="{_num(x(mid))}" '
                f'y1="{y - 8}" y2="{y + 8}"><title>{escape(name)} median '
                f"{escape(f'{mid:.4g}')}</title></line>"
            )
    return _svg(width, height, label, body, "chart-strips")
