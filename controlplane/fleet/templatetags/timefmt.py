"""One way to show a moment: `{{ value|moment }}`.

Every timestamp on a page goes through this filter so it reads the same everywhere:

    <time datetime="2026-11-30T23:09:37Z" title="2026-11-30 23:09:37 UTC" data-local>
      2026-11-30 23:09:37 UTC</time>

The server renders UTC *with the zone written out* (so the page is right without JavaScript),
and static/js/time.js rewrites the text of every `<time data-local>` into the viewer's own
zone with its abbreviation, leaving UTC in the title for hover. `|moment:"time"` shows the
clock only (the title keeps the full date); `|duration` formats an elapsed timedelta or
seconds as "1 h 02 min", "3 min 04 s", "850 ms".
"""

from __future__ import annotations

import datetime as dt

from django import template
from django.utils.html import format_html

register = template.Library()

_FORMATS = {"full": "%Y-%m-%d %H:%M:%S", "time": "%H:%M:%S", "minute": "%Y-%m-%d %H:%M"}


def as_utc(value: dt.datetime) -> dt.datetime:
    """Aware → UTC; naive values are taken to be UTC already (settings.USE_TZ stores UTC)."""
    if value.tzinfo is None:
        return value.replace(tzinfo=dt.UTC)
    return value.astimezone(dt.UTC)


@register.filter(is_safe=True)
def moment(value: object, style: str = "full") -> str:
    """A `<time>` element in UTC with the zone shown; time.js localises it in the browser."""
    if not isinstance(value, dt.datetime):
        return "" if value is None else str(value)
    utc = as_utc(value)
    fmt = _FORMATS.get(style, _FORMATS["full"])
    iso = utc.isoformat(timespec="seconds").replace("+00:00", "Z")
    return format_html(
        '<time datetime="{}" title="{} UTC" data-local="{}">{} UTC</time>',
        iso,
        utc.strftime(_FORMATS["full"]),
        style if style in _FORMATS else "full",
        utc.strftime(fmt),
    )


def format_seconds(seconds: float) -> str:
    """Elapsed time for humans: the two largest units, no more."""
    if seconds < 0:
        seconds = 0.0
    if seconds < 1:
        return f"{round(seconds * 1000)} ms"
    if seconds < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{int(seconds)} s"
    total = int(seconds)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes:02d} min"
    return f"{minutes} min {secs:02d} s"


@register.filter
def duration(value: object) -> str:
    """`timedelta` or seconds (int/float) → "3 min 04 s"; anything else → ""."""
    if isinstance(value, dt.timedelta):
        return format_seconds(value.total_seconds())
    if isinstance(value, int | float) and not isinstance(value, bool):
        return format_seconds(float(value))
    return ""


@register.simple_tag
def elapsed(start: object, end: object = None) -> str:
    """Time between two moments; without an end, until now (a running step)."""
    if not isinstance(start, dt.datetime):
        return ""
    if not isinstance(end, dt.datetime):
        from django.utils import timezone

        end = timezone.now()
    return format_seconds((as_utc(end) - as_utc(start)).total_seconds())


@register.filter
def duration_ms(value: object) -> str:
    """Milliseconds (as stored for calls and steps) → "1.2 s", "850 ms"."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return format_seconds(float(value) / 1000)
    return ""
