"""Hostile strings, and the check that none of them reached a page as markup.

Every hostile value carries a unique tag (`hx007x`). The tag survives escaping, JSON and URL
encoding, so "did this value reach the page at all" is a plain substring test; whether it
reached it as markup is decided by parsing the HTML, as a browser would.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from html.parser import HTMLParser

#: One payload carries every vector, so each input field is tried with all of them: closing
#: the surrounding `<code>`, a script element, breaking out of a quoted attribute into an
#: element with an event handler, and bidi controls (RLO, LRI) that would reorder the text.
PAYLOAD = "</code><script>x()</script>\"><img src=x onerror=alert(1)>'\u202e\u2066"
#: For fields that end up in URLs or are URLs themselves.
URL_PAYLOAD = "javascript:alert(1)"

#: Bidi controls as they must never appear raw in HTML (matches controlplane.html).
BIDI = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
#: The only scripts a page may load: our own static files.
OWN_SCRIPT = re.compile(r"^/static/")
URL_ATTRIBUTES = {"href", "src", "action", "formaction", "xlink:href", "hx-get", "hx-post"}


@dataclass
class HostileValue:
    tag: str
    channel: str
    value: str
    #: False when the input is refused and the refusal is JSON (nothing to show on a page).
    shown: bool = True


@dataclass
class Hostile:
    """Hands out tagged hostile values and remembers which channel each one went through."""

    values: list[HostileValue] = field(default_factory=list)

    def __call__(self, channel: str, *, template: str = "{tag}" + PAYLOAD, shown=True) -> str:
        tag = f"hx{len(self.values):03d}x"
        value = template.format(tag=tag)
        self.values.append(HostileValue(tag, channel, value, shown))
        return value

    def url(self, channel: str, *, shown=True) -> str:
        return self(channel, template=URL_PAYLOAD + "//{tag}", shown=shown)


class _Markup(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.problems: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        names = dict(attrs)
        if tag == "script" and not OWN_SCRIPT.match(names.get("src") or ""):
            self.problems.append(f"<script> not from /static/: {attrs}")
        if tag in ("img", "iframe", "object", "embed", "base"):
            self.problems.append(f"<{tag}> element: {attrs}")
        # Our charts are server-rendered SVG (controlplane/charts.py), always `class="chart …"`;
        # any other <svg> came from somewhere else. What is inside one is checked like the rest.
        if tag == "svg" and (names.get("class") or "").split()[:1] != ["chart"]:
            self.problems.append(f"<svg> element not one of our charts: {attrs}")
        for name, value in attrs:
            if name.startswith("on"):
                self.problems.append(f"event handler attribute {name}={value!r} on <{tag}>")
            if name in URL_ATTRIBUTES and (value or "").strip().lower().startswith("javascript:"):
                self.problems.append(f'{name}="javascript:…" on <{tag}>')
            if name == "style":
                self.problems.append(f"inline style attribute on <{tag}> (blocked by the CSP)")

    handle_startendtag = handle_starttag


def unescaped(html: str) -> list[str]:
    """What in `html` a browser would run or misdisplay: [] when it is clean."""
    parser = _Markup()
    parser.feed(html)
    parser.close()
    problems = parser.problems
    for match in BIDI.finditer(html):
        start = max(match.start() - 30, 0)
        near = html[start : match.end()]
        problems.append(f"raw bidi control U+{ord(match.group()):04X} near {near!r}")
    return problems


def csp_problems(response) -> list[str]:
    """Why `response`'s Content-Security-Policy does not hold scripts to our own files."""
    header = response.get("Content-Security-Policy")
    if not header:
        return ["no Content-Security-Policy header"]
    directives = {
        name: values
        for name, _, values in (d.strip().partition(" ") for d in header.split(";") if d.strip())
    }
    scripts = directives.get("script-src", directives.get("default-src", ""))
    problems = []
    if "'unsafe-inline'" in scripts or "'unsafe-eval'" in scripts or "*" in scripts.split():
        problems.append(f"script-src allows inline or foreign script: {scripts!r}")
    if directives.get("object-src") != "'none'":
        problems.append("object-src is not 'none'")
    return problems
