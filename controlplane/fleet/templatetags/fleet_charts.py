"""Chart tags: version_chart, fleet_map and discovery_latency.

Tags rather than view context so a live re-render of a fragment carries its chart too.
"""

from __future__ import annotations

from django import template
from django.utils.safestring import SafeString

from controlplane.fleet import charts
from controlplane.fleet.models import Source

register = template.Library()


@register.simple_tag
def version_chart(source: Source | None = None) -> SafeString:
    """For one source (per namespace), or, without one, for every source (per source/namespace)."""
    if source is None:
        return charts.version_chart(Source.objects.all(), by_source=True)
    return charts.version_chart([source], by_source=False)


@register.simple_tag
def fleet_map(source: Source) -> charts.FleetMap:
    """Use as `{% fleet_map source as map %}`: the fragment renders its payload and summary."""
    return charts.fleet_map(source)


@register.simple_tag
def discovery_latency(source: Source) -> SafeString:
    return charts.discovery_latency(source)
