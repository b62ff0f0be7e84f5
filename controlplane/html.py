"""Rules for every piece of HTML we send: escaped text, and no invisible direction controls.

Autoescaping stops markup, but not Unicode bidirectional controls (U+202E RIGHT-TO-LEFT
OVERRIDE, U+2066 LEFT-TO-RIGHT ISOLATE, ...). A worker name, model path or weight version that
carries one is displayed reordered ("Trojan Source"), so an approver could read a different
checkpoint from the one that will be loaded. A character reference (`&#x202e;`) would still
reorder the text, so every rendered page, partial and websocket fragment shows them as the
visible marker `[U+202E]` instead. Our own templates contain none, and names in this
application never need one; a form re-displaying such a value shows the marker, so saving it
replaces the control with visible text.

`TemplateEngine` applies the rule to everything the template engine renders (pages, inline
partials, fragments the consumers render with `render_to_string`); HTML built in Python (the
hot worker rows) uses `text()` or `neutralize_bidi()` itself.
"""

from __future__ import annotations

import re

from django import template
from django.template import TemplateDoesNotExist
from django.template.backends.django import DjangoTemplates, reraise
from django.template.backends.django import Template as DjangoTemplate
from django.utils.html import escape
from django.utils.safestring import SafeString

#: Explicit bidirectional formatting characters (Unicode TR9 §2) plus the implicit marks.
BIDI_CONTROLS = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _marker(match: re.Match[str]) -> str:
    return f"[U+{ord(match.group()):04X}]"


def neutralize_bidi(html: str) -> str:
    """`html` with each bidi control replaced by visible ASCII; keeps it a SafeString.

    The marker has no markup characters, so it is safe in text and in attribute values alike
    and cannot turn escaped text into markup.
    """
    if not BIDI_CONTROLS.search(html):
        return html
    replaced = BIDI_CONTROLS.sub(_marker, html)
    return SafeString(replaced) if isinstance(html, SafeString) else replaced


def text(value: object) -> str:
    """Outside data as HTML text: escaped, bidi controls made visible."""
    return neutralize_bidi(str(escape(value)))


class Template(DjangoTemplate):
    def render(self, context=None, request=None) -> str:
        return neutralize_bidi(super().render(context, request))


class TemplateEngine(DjangoTemplates):
    """Django's template engine whose output never carries a raw bidi control."""

    def from_string(self, template_code):
        return Template(self.engine.from_string(template_code), self)

    def get_template(self, template_name):
        try:
            return Template(self.engine.get_template(template_name), self)
        except TemplateDoesNotExist as exc:
            reraise(exc, self)


# `{{ text|code_spans }}` (a builtin filter, settings.TEMPLATES): Markdown's backtick spans as
# <code>, for help text written with them (API descriptions, scope notes). The whole text is
# escaped first, so outside data inside it (a namespace in a scope note) stays text; escaping
# never produces a backtick, so the spans found afterwards are the ones written.
register = template.Library()
CODE_SPAN = re.compile(r"`([^`\n]+)`")


@register.filter(is_safe=True)
def code_spans(value) -> SafeString:
    escaped = str(escape("" if value is None else value))
    return SafeString(CODE_SPAN.sub(r"<code>\1</code>", escaped))


def _scalar(value) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def _readable_lines(value, indent: int) -> list[str]:
    pad = " " * indent
    if isinstance(value, dict):
        if not value:
            return [f"{pad}(none)"]
        lines = []
        for key, item in value.items():
            if isinstance(item, dict | list | tuple) and item and not _flat_list(item):
                lines.append(f"{pad}{key}:")
                lines.extend(_readable_lines(item, indent + 2))
            else:
                lines.append(f"{pad}{key}: {_inline(item)}")
        return lines
    if isinstance(value, list | tuple):
        if _flat_list(value):
            return [f"{pad}{_inline(value)}"]
        lines = []
        for item in value:
            sub = _readable_lines(item, indent + 2)
            lines.append(f"{pad}- {sub[0].lstrip()}")
            lines.extend(sub[1:])
        return lines
    return [f"{pad}{_scalar(value)}"]


def _flat_list(value) -> bool:
    return isinstance(value, list | tuple) and not any(
        isinstance(v, dict | list | tuple) for v in value
    )


def _inline(value) -> str:
    if isinstance(value, list | tuple):
        return ", ".join(_scalar(v) for v in value) if value else "(none)"
    if isinstance(value, dict):
        return "(none)"
    return _scalar(value)


@register.filter
def key_values(value) -> str:
    """A JSON-like value (audit details, an event's details) as `key: value` lines, nested ones
    indented: for a <pre>, instead of a Python repr. Plain text: the template escapes it."""
    return "\n".join(_readable_lines(value, 0))
