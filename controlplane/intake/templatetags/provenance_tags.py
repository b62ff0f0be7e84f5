"""`{{ version|version_link }}`: a weight version rendered as a link to its provenance trail,
so any page that shows a version leads to where it came from. A template builtin (settings),
so using it is a one-line edit in any template.

Escaped like any other value (`format_html`); an empty version renders as "—", and a version
no URL can carry (a line break) as plain text.
"""

from django import template
from django.urls import NoReverseMatch, reverse
from django.utils.html import format_html

from controlplane.intake.provenance.trail import version_key

register = template.Library()


@register.filter
def version_url(version) -> str:
    return reverse("provenance:version", args=[version_key(version)])


@register.filter
def version_link(version):
    if version is None or version == "":
        return "—"
    try:
        url = version_url(version)
    except NoReverseMatch:
        return format_html("<code>{}</code>", version_key(version))
    return format_html(
        '<a class="version-link" href="{}" title="Provenance of this version"><code>{}</code></a>',
        url,
        version_key(version),
    )
