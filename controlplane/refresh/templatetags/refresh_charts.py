"""Chart tags: phase_timeline, worker_timeline, refresh_clock, refresh_eta, refresh_history.

Tags rather than view context: the refresh page's live fragment is re-rendered on every state
change, and the timeline must come with it.
"""

from __future__ import annotations

from django import template
from django.utils.safestring import SafeString

from controlplane.fleet.models import Source
from controlplane.refresh import charts, eta
from controlplane.refresh.models import PolicyRefresh

register = template.Library()


@register.simple_tag
def phase_timeline(refresh: PolicyRefresh) -> SafeString:
    return charts.phase_timeline(refresh)


@register.simple_tag
def worker_timeline(refresh: PolicyRefresh) -> charts.WorkerTimeline:
    return charts.worker_timeline(refresh)


@register.simple_tag
def refresh_eta(refresh: PolicyRefresh) -> eta.Eta | None:
    return eta.estimate(refresh)


@register.simple_tag
def refresh_clock(refresh: PolicyRefresh) -> charts.Clock:
    return charts.clock(refresh)


@register.simple_tag
def refresh_history(source: Source) -> SafeString:
    return charts.refresh_history(source)
