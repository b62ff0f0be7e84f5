"""`{% load refresh_tags %}{% refresh_banner source %}` — gates and the active-refresh banner.

For fleet pages: with a source it shows that source's gates and active refresh; without one,
every source's. It connects its own websocket and keeps itself current.

`{{ body|json_text }}` shows a planned call's JSON body as text (autoescaped like any text).
`{{ body|json_pretty }}` shows it indented, for a `<pre>`.
"""

import json
from urllib.parse import urlsplit

from django import template

from controlplane.refresh import presenters

register = template.Library()


@register.inclusion_tag("refresh/banner.html", takes_context=True)
def refresh_banner(context, source=None):
    return presenters.banner_context(source) | {
        "perms": context.get("perms"),
        "banner_ws": f"/ws/refresh-banner/{source.pk if source else 0}/",
    }


@register.inclusion_tag("refresh/gate_badges.html")
def gate_badges(source):
    """Compact gate and refresh badges for one source, without a socket of its own."""
    return presenters.banner_context(source) | {"banner_gates": presenters.gates_of(source)}


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


@register.filter
def url_path(value) -> str:
    """A call's URL without its scheme and host (the worker column names the worker; the full
    URL stays in the cell's title and in the API's journal)."""
    parts = urlsplit(str(value or ""))
    return parts.path + (f"?{parts.query}" if parts.query else "") if parts.netloc else str(value)
