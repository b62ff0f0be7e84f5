"""`{% refresh_capacity refresh as capacity %}`: the capacity section's data and chart.

A tag rather than view context for the same reason as the phase timeline: the refresh page's
live fragment is re-rendered on every state and step change, and the chart must come with it.
"""

from __future__ import annotations

from django import template

from controlplane.refresh import capacity_chart
from controlplane.refresh.models import PolicyRefresh

register = template.Library()


@register.simple_tag
def refresh_capacity(refresh: PolicyRefresh) -> capacity_chart.CapacityView | None:
    return capacity_chart.view(refresh)
