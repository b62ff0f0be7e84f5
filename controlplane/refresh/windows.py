"""Version windows and provenance, read from the serving ledger (never from gate audit rows).

A worker's window for a version is the run of its ledger intervals at that version; a
namespace's admission window for a version is when some instance of it was admitted at it.
`served_at` answers the trainer's after-the-fact question: which version(s) could instance X
have served at time t (or during [t1, t2]), with the evidence and how sure we are:

- `verified`: admitted and verified at that version (by a refresh or a catch-up);
- `forced`: admitted on a person's say-so at the version its readback reported;
- `in_transition`: a refresh was moving it (gate closed for it, paused in a wave, left out):
  it served the old version or the refresh's target;
- `unverified`: serving outside its gate (a joiner, a drifted or released worker), at the
  version it reported, if any;
- `unknown`: nothing read its version back (a force-reopen without a readback): the version
  recorded is the last one seen, not a claim;
- `departed`: gone; it served nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Q

from controlplane.refresh.models import (
    VERIFIED_EVIDENCE,
    Admission,
    Evidence,
    PolicyRefresh,
    Serving,
    ServingInterval,
)

VERIFIED, FORCED, IN_TRANSITION, UNVERIFIED, UNKNOWN, DEPARTED = (
    "verified",
    "forced",
    "in_transition",
    "unverified",
    "unknown",
    "departed",
)


@dataclass
class Served:
    """One ledger interval as a provenance answer."""

    source: str
    namespace: str
    instance_id: str
    key: str
    #: The versions it could have served in the interval (two while in transition).
    versions: list[Any]
    version: Any
    confidence: str
    evidence: str
    evidence_detail: dict[str, Any]
    admitted: bool
    admission: str
    serving: str
    valid_from: datetime
    valid_to: datetime | None
    refresh_id: int | None
    quarantine_id: int | None
    transition_refresh_id: int | None
    forced: dict[str, Any] | None = None
    cause: str = ""
    discovery_run_id: int | None = None
    journal_ids: list[int] = field(default_factory=list)


def confidence_of(row: ServingInterval) -> str:
    if row.serving == Serving.DEPARTED:
        return DEPARTED
    if row.evidence == Evidence.UNKNOWN:
        return UNKNOWN  # no claim, even in transition: where it started from is not known
    if row.transition_refresh_id is not None or row.serving == Serving.PAUSED:
        return IN_TRANSITION
    if row.admitted and row.admission == Admission.FORCED:
        return FORCED
    if row.admitted and row.evidence in VERIFIED_EVIDENCE:
        return VERIFIED
    return UNVERIFIED


def served_at(
    instance_id: str,
    start: datetime,
    end: datetime | None = None,
    *,
    source_ids: Iterable[int] | None = None,
) -> list[Served]:
    """The ledger intervals of `instance_id` that overlap `start` (a point, when `end` is
    None) or [start, end], oldest first; limited to `source_ids` when given."""
    end = end or start
    rows = ServingInterval.objects.filter(instance_id=instance_id, valid_from__lte=end).filter(
        Q(valid_to__isnull=True) | Q(valid_to__gt=start)
    )
    if source_ids is not None:
        rows = rows.filter(source_id__in=list(source_ids))
    found = list(rows.select_related("source").order_by("valid_from", "id"))
    targets = _targets({r.transition_refresh_id for r in found if r.transition_refresh_id})
    return [_served(r, targets) for r in found]


def _targets(refresh_ids: set[int]) -> dict[int, Any]:
    if not refresh_ids:
        return {}
    return {
        pk: (target or {}).get("weight_version")
        for pk, target in PolicyRefresh.objects.filter(pk__in=refresh_ids).values_list(
            "pk", "target"
        )
    }


def _served(row: ServingInterval, targets: dict[int, Any]) -> Served:
    confidence = confidence_of(row)
    versions: list[Any] = []
    if confidence not in (DEPARTED, UNKNOWN) and row.version is not None:
        versions.append(row.version)
    if confidence == IN_TRANSITION and row.transition_refresh_id in targets:
        target = targets[row.transition_refresh_id]
        if target not in versions:
            versions.append(target)
    forced = None
    if row.admission == Admission.FORCED:
        forced = {
            "by": row.forced_by,
            "at": row.forced_at.isoformat() if row.forced_at else None,
            "reason": row.forced_reason,
        }
    return Served(
        source=row.source.name,
        namespace=row.namespace,
        instance_id=row.instance_id,
        key=row.key,
        versions=versions,
        version=row.version,
        confidence=confidence,
        evidence=row.evidence,
        evidence_detail=dict(row.evidence_detail or {}),
        admitted=row.admitted,
        admission=row.admission,
        serving=row.serving,
        valid_from=row.valid_from,
        valid_to=row.valid_to,
        refresh_id=row.refresh_id,
        quarantine_id=row.quarantine_id,
        transition_refresh_id=row.transition_refresh_id,
        forced=forced,
        cause=row.cause,
        discovery_run_id=row.discovery_run_id,
        journal_ids=list(row.journal_ids or []),
    )


@dataclass
class Window:
    """When one instance (or a namespace's gate) served (or admitted) one version."""

    source: str
    namespace: str
    version: Any
    start: datetime
    end: datetime | None
    instance_id: str = ""
    key: str = ""
    confidence: str = ""


def worker_windows(version: Any, *, source_ids: Iterable[int] | None = None) -> list[Window]:
    """Per instance, when it started and stopped serving `version` (consecutive intervals at
    the version merged; departed intervals end it)."""
    rows = (
        _at_version(version, source_ids)
        .exclude(serving=Serving.DEPARTED)
        .only(*_WINDOW_COLUMNS, "key", "transition_refresh_id")
    )
    windows: dict[tuple[int, str, str], Window] = {}
    out: list[Window] = []
    for row in rows.order_by("source_id", "namespace", "instance_id", "valid_from", "id"):
        scope = (row.source_id, row.namespace, row.instance_id)
        open_window = windows.get(scope)
        if open_window is not None and open_window.end == row.valid_from:
            open_window.end = row.valid_to
            continue
        window = Window(
            row.source.name,
            row.namespace,
            row.version,
            row.valid_from,
            row.valid_to,
            instance_id=row.instance_id,
            key=row.key,
            confidence=confidence_of(row),
        )
        windows[scope] = window
        out.append(window)
    return out


@dataclass
class AdmissionSpan:
    """When one namespace's gate admitted some instance at one version (from the ledger)."""

    source: str
    namespace: str
    version: Any
    start: datetime
    end: datetime | None
    #: Who or what admitted the first instance (a refresh's verification, a person's force).
    opened_by: str
    forced: bool
    refresh_id: int | None
    instances: set[str] = field(default_factory=set)
    #: Why the last admitted instance stopped being admitted at it (the next fact's cause).
    closed_by: str = ""


def admission_windows(
    version: Any, *, source_ids: Iterable[int] | None = None
) -> list[AdmissionSpan]:
    """Per namespace, when its gate admitted some instance at `version` (the union of the
    admitted intervals at the version), oldest first."""
    rows = (
        _at_version(version, source_ids)
        .exclude(admission="")
        .filter(serving=Serving.SERVING)
        .only(*_WINDOW_COLUMNS, "forced_by", "cause", "refresh_id")
    )
    spans: dict[tuple[int, str], list[AdmissionSpan]] = {}
    for row in rows.order_by("source_id", "namespace", "valid_from", "id"):
        scope = (row.source_id, row.namespace)
        runs = spans.setdefault(scope, [])
        last = runs[-1] if runs else None
        if last is not None and (last.end is None or last.end >= row.valid_from):
            if last.end is not None and (row.valid_to is None or row.valid_to > last.end):
                last.end = row.valid_to
            last.instances.add(row.instance_id)
            last.forced = last.forced or row.admission == Admission.FORCED
            continue
        forced = row.admission == Admission.FORCED
        runs.append(
            AdmissionSpan(
                source=row.source.name,
                namespace=row.namespace,
                version=row.version,
                start=row.valid_from,
                end=row.valid_to,
                opened_by=row.forced_by if forced else row.cause,
                forced=forced,
                refresh_id=row.refresh_id,
                instances={row.instance_id},
            )
        )
    out = [w for runs in spans.values() for w in runs]
    ended = [(w, w.end) for w in out if w.end is not None]
    if ended:  # why each span ended: the cause of the fact that ended it (one query)
        causes = {
            (ns, at): cause
            for ns, at, cause in ServingInterval.objects.filter(
                namespace__in={w.namespace for w, _ in ended},
                valid_from__in={end for _, end in ended},
            ).values_list("namespace", "valid_from", "cause")
        }
        for span, end in ended:
            span.closed_by = causes.get((span.namespace, end), "")
    return sorted(out, key=lambda w: (w.start, w.source, w.namespace))


def admitted_at(source, namespaces: Iterable[str], at: datetime) -> dict[str, list[Any]]:
    """Per namespace, the admitted instances' versions at `at`, from the ledger (what its gate
    admitted then; none: it admitted nobody). One query."""
    rows = (
        ServingInterval.objects.filter(
            source=source, namespace__in=list(namespaces), valid_from__lte=at
        )
        .filter(Q(valid_to__isnull=True) | Q(valid_to__gt=at))
        .exclude(admission="")
        .filter(serving=Serving.SERVING)
        .only("namespace", "version", "evidence", "admission", "serving")
        .order_by("namespace", "instance_id")
    )
    out: dict[str, list[Any]] = {}
    for row in rows:
        out.setdefault(row.namespace, []).append(
            {"version": row.version, "verified": row.verified, "admission": row.admission}
        )
    return out


#: What a window is made of (with the source's name): a version's windows span the fleet, and
#: the intervals' other columns (evidence detail, journal ids: JSON) are not decoded for them.
_WINDOW_COLUMNS = (
    "source__name",
    "namespace",
    "instance_id",
    "version",
    "evidence",
    "admission",
    "serving",
    "valid_from",
    "valid_to",
)


def _at_version(version: Any, source_ids: Iterable[int] | None):
    """Intervals at `version` (`1200` also finds a version sent as the integer 1200)."""
    candidates = [version]
    if isinstance(version, str) and version.isdigit():
        candidates.append(int(version))
    query = Q()
    for candidate in candidates:
        query |= Q(version=candidate)
    rows = ServingInterval.objects.filter(query).select_related("source")
    if source_ids is not None:
        rows = rows.filter(source_id__in=list(source_ids))
    return rows


__all__ = [
    "DEPARTED",
    "FORCED",
    "IN_TRANSITION",
    "UNKNOWN",
    "UNVERIFIED",
    "VERIFIED",
    "AdmissionSpan",
    "Served",
    "Window",
    "admission_windows",
    "admitted_at",
    "confidence_of",
    "served_at",
    "worker_windows",
]
