"""Gates follow their source's discovery: a source nobody can see has `unknown` gates.

Two paths, one rule (`source_is_unknown`):
- fast: after every discovery run (`fleet.signals.discovery_finished`), a source that just went
  stale marks its admitting gates `unknown`, and a run that succeeded restores them;
- slow: a beat task (`refresh.sync_gate_freshness`, every discovery tick) catches what no run
  reports — discovery stopped altogether (beat or workers down, source disabled), so the last
  success only grows older — and repairs anything the fast path missed (a refresh that
  reopened gates while its source was stale).
Gate writes go through `refresh.gates` (audited, published, notified).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from controlplane.audit.recorder import Actor
from controlplane.fleet.models import Source
from controlplane.refresh import gates
from controlplane.refresh.models import ADMITTING_STATES, GateState

logger = logging.getLogger(__name__)
SYSTEM = Actor.system("gate freshness")


def stale_after(source: Source) -> timedelta:
    """How old the last successful discovery of `source` may be before its gates are unknown."""
    seconds = max(
        settings.GATE_STALE_AFTER_SECONDS,
        settings.GATE_STALE_INTERVALS * source.discovery_interval_seconds,
    )
    return timedelta(seconds=seconds)


def source_is_unknown(source: Source, now: datetime | None = None) -> bool:
    if source.stale:
        return True
    last = source.last_success_at
    return last is None or (now or timezone.now()) - last > stale_after(source)


def sync_source(source: Source, now: datetime | None = None) -> list:
    """Mark or restore the gates of one source; returns the gates changed."""
    with transaction.atomic():
        if source_is_unknown(source, now):
            return gates.mark_source_unknown(source, actor=SYSTEM)
        return gates.restore_source_known(source, actor=SYSTEM)


def sync_all(now: datetime | None = None) -> dict[str, int]:
    """The beat task's pass: only sources whose gates could change (admitting or unknown)."""
    now = now or timezone.now()
    watched = Source.objects.filter(
        gates__state__in=[*ADMITTING_STATES, GateState.UNKNOWN]
    ).distinct()
    marked = restored = 0
    for source in watched:
        changed = sync_source(source, now)
        if changed and changed[0].state == GateState.UNKNOWN:
            marked += len(changed)
        else:
            restored += len(changed)
    return {"marked_unknown": marked, "restored": restored}


def on_discovery_finished(sender, *, source_id: int, ok: bool, went_stale: bool, **kwargs) -> None:
    """Receiver of `fleet.signals.discovery_finished`: quick, and it never raises."""
    try:
        if not (went_stale or ok):
            return  # still failing: already unknown (or the beat task sees it)
        source = Source.objects.filter(pk=source_id).first()
        if source is not None:
            sync_source(source)
    except Exception:
        logger.exception("gate freshness after discovery of source %s failed", source_id)
