"""Plans that were never started do not wait forever: after `PLAN_EXPIRY_SECONDS` they are
discarded through the same action an operator uses (audited, actor "system"), which frees the
source for the next plan and keeps stale calls from ever being confirmed."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from controlplane.audit.recorder import Actor
from controlplane.refresh.errors import RefreshError
from controlplane.refresh.intents.action_table import DISCARD, ActionInput
from controlplane.refresh.models import PolicyRefresh, RefreshState


def expire_stale_plans(now=None) -> list[int]:
    """Discard every plan older than the expiry; returns the ids discarded."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.PLAN_EXPIRY_SECONDS)
    stale = PolicyRefresh.objects.filter(state=RefreshState.PLANNED, created_at__lt=cutoff)
    reason = f"plan expired unstarted after {settings.PLAN_EXPIRY_SECONDS:g} s"
    discarded = []
    for refresh in stale.order_by("id"):
        try:
            DISCARD.run(refresh, Actor.system(), ActionInput(reason=reason))
        except RefreshError:
            continue  # started (or discarded) meanwhile: the lock inside the action decides
        discarded.append(refresh.pk)
    return discarded
