"""`{% load refresh_tags %}{% refresh_banner source %}` — gates and the active-refresh banner.

For fleet pages: with a source it shows that source's gates and active refresh; without one,
every source's. It connects its own websocket and keeps itself current.

`{{ body|json_text }}` shows a planned call's JSON body as text (autoescaped like any text).
`{{ body|json_pretty }}` shows it indented, for a `<pre>`.
`{{ body|json_preview }}` is that, cut short after `BODY_PREVIEW_CHARS` (`.text`, `.more`).
`{{ refresh|canary_review }}` is the canary's review with its analysis read from the run's row.
`{{ refresh|strategy_text }}` says how a refresh (or a strategy's JSON form) walks its scope.
`{{ value|label }}` shows a stored identifier (`open_forced`, `force_reopened`) in words.
"""

import json
from dataclasses import dataclass
from urllib.parse import urlsplit

from django import template
from django.core.exceptions import ValidationError

from controlplane.refresh import canary_review as reviews
from controlplane.refresh import presenters, source_badges
from controlplane.refresh.models import GateState
from controlplane.refresh.strategy import parse_strategy

register = template.Library()


@register.inclusion_tag("refresh/banner.html", takes_context=True)
def refresh_banner(context, source=None):
    return presenters.banner_context(source) | {
        "perms": context.get("perms"),
        "banner_ws": f"/ws/refresh-banner/{source.pk if source else 0}/",
    }


#: The render-context key of the gate badges read once per page render.
_GATE_BADGES = object()


@register.inclusion_tag("refresh/gate_badges.html", takes_context=True)
def gate_badges(context, source):
    """Compact gate and refresh badges for one source, without a socket of its own (read for
    every source the page lists at once: `refresh.source_badges`)."""
    badges = source_badges.for_source(
        context, _GATE_BADGES, source, presenters.gate_badges_by_source
    )
    return {"banner_source": source, **badges}


@register.filter
def json_text(value) -> str:
    """A JSON-able value as compact JSON text, for showing an exact request body.

    Returns a plain string, so autoescaping applies: a model path such as
    `/c/</code><script>…` is shown, never parsed. Non-ASCII stays readable; the engine makes
    bidi controls visible (`controlplane.html`).
    """
    if value is None:
        return ""
    return json.dumps(value, ensure_ascii=False, default=str)


@register.filter
def json_pretty(value) -> str:
    """A JSON-able value as indented JSON (for a `<pre>`), autoescaped like `json_text`:
    stored bodies are shown as JSON, never as Python reprs (`{'mode': 'keep'}`, `None`)."""
    if value is None or value == "":
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, indent=2, sort_keys=True, default=str)


#: How much of a call's indented body the refresh page's journal shows. A fleet-wide call's
#: body names every worker (the listener's listing, the agreement check's request): about
#: 50 bytes a worker, so at 10,000 workers each such row would be half a megabyte of the
#: page. Past this, the row says how much is left and links to the whole call in the API.
BODY_PREVIEW_CHARS = 2_000


@dataclass(frozen=True, slots=True)
class BodyPreview:
    text: str
    #: Characters of the indented body left out (0: `text` is all of it).
    more: int = 0


@register.filter
def json_preview(value) -> BodyPreview:
    """`json_pretty`, cut after `BODY_PREVIEW_CHARS` characters; autoescaped like it."""
    text = json_pretty(value)
    if len(text) <= BODY_PREVIEW_CHARS:
        return BodyPreview(text)
    return BodyPreview(text[:BODY_PREVIEW_CHARS], len(text) - BODY_PREVIEW_CHARS)


@register.filter
def canary_review(refresh):
    """The canary's review as the page shows it (`refresh.canary_review.review`): the
    analysis's outcome is its run's row, not a copy in the progress."""
    return reviews.review(refresh)


@register.filter
def url_path(value) -> str:
    """A call's URL without its scheme and host (the worker column names the worker; the full
    URL stays in the cell's title and in the API's journal)."""
    parts = urlsplit(str(value or ""))
    return parts.path + (f"?{parts.query}" if parts.query else "") if parts.netloc else str(value)


@register.filter
def strategy_text(refresh_or_strategy) -> str:
    """`{{ refresh|strategy_text }}` (or a source's `default_strategy`): one line saying how
    it walks its scope. A stored strategy that no longer validates is shown as such, not
    raised: a page must render whatever the database holds."""
    raw = getattr(refresh_or_strategy, "strategy", refresh_or_strategy)
    try:
        return parse_strategy(raw or None).describe()
    except ValidationError as exc:
        return "invalid strategy: " + "; ".join(exc.messages)


@register.filter
def pairs(mapping) -> list[tuple[str, object]]:
    """`{% for k, v in d|pairs %}`: a dict's items in key order. Unlike `d.items` in a
    template, a key named "items" in data from outside cannot stand in for the method."""
    if not isinstance(mapping, dict):
        return []
    return sorted(((str(k), v) for k, v in mapping.items()), key=lambda kv: kv[0])


#: Stored identifiers shown on pages, in words; anything else has its underscores spaced.
LABELS: dict[str, str] = {
    **{str(value): str(text) for value, text in GateState.choices},
    "force_reopened": "force-reopened",
    "reopened": "reopened (verified)",
}


@register.filter
def label(value) -> str:
    """A stored identifier in words: `open_forced` → "open (forced)"."""
    text = "" if value is None else str(value)
    return LABELS.get(text, text.replace("_", " "))
