"""The one writer of the serving ledger (`models.ServingInterval`).

Every path that learns what a worker serves, or changes whether its gate admits it, records a
fact here: the executor (verified, paused in a wave, left out), quarantine catch-up (verified
again), drift (reported at another version, departed), force-reopen (admitted on a person's
say-so at what the readback says). They never write a gate: `gates.py` calls these functions
under the gate row's lock and then recomputes the gate from the ledger (`gates.project`).

A fact is a set of field changes for one (namespace, instance id). `write` reads the current
intervals of all the instances concerned in one query, ends those that change in one UPDATE and
appends their successors in one INSERT, so a refresh of 2,000 workers costs what one of 100
does. A fact that changes nothing appends nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any, NamedTuple, TypedDict

from django.utils import timezone

from controlplane import bulk, lockorder
from controlplane.dynamo.discovery import worker_key
from controlplane.fleet.models import Worker
from controlplane.refresh.models import (
    Admission,
    Evidence,
    JournalEntry,
    PlannedWorker,
    PolicyRefresh,
    QuarantineCall,
    Serving,
    ServingInterval,
)
from controlplane.refresh.targets import straddling_modes
from controlplane.textlimits import CAUSE_CHARS


#: The fields that make an interval what it is (a fact changing none of them is no change).
class EvidenceDetail(TypedDict, total=False):
    """`ServingInterval.evidence_detail`: which checks stand behind the interval's evidence.
    This module owns its keys."""

    #: The version was read back from the engine (or, reported: the worker declared it).
    readback: bool
    #: A generation pinned to the instance, and the cross-worker agreement it passed (the
    #: rule's kind, or "cross-check" for a catch-up; "" when none).
    generation: bool
    agreement: str
    liveness: bool
    #: Requests in flight were kept across the update (`inflight_may_straddle`): the window
    #: is mixed, with the pause mode that kept them.
    mixed: bool
    in_flight: str
    pause_mode: str


_MEANING = (
    "version",
    "evidence",
    "refresh_id",
    "quarantine_id",
    "transition_refresh_id",
    "admission",
    "forced_by",
    "forced_at",
    "forced_reason",
    "serving",
)
#: The fields a successor inherits from its predecessor unless the fact sets them.
_CARRIED = (*_MEANING, "key", "evidence_detail")

#: A fact: the changes for one instance, or a function of its current interval (None: none).
Change = Mapping[str, Any] | Callable[[ServingInterval | None], Mapping[str, Any] | None]
Facts = Mapping[tuple[str, str], Change]

_DEFAULTS: dict[str, Any] = {
    "key": "",
    "version": None,
    "evidence": Evidence.UNKNOWN,
    "evidence_detail": {},
    "refresh_id": None,
    "quarantine_id": None,
    "transition_refresh_id": None,
    "admission": Admission.NOT_ADMITTED,
    "forced_by": "",
    "forced_at": None,
    "forced_reason": "",
    "serving": Serving.SERVING,
}


def current(source, namespaces: Iterable[str]) -> list[ServingInterval]:
    """The current interval of every instance the ledger knows in these namespaces."""
    return list(
        ServingInterval.objects.filter(
            source=source, namespace__in=list(namespaces), valid_to__isnull=True
        ).order_by("namespace", "instance_id")
    )


#: Per instance, the journal rows behind its fact (`JournalEntry` or `QuarantineCall` ids).
Journal = Mapping[tuple[str, str], list[int]]

#: The steps whose calls are the evidence of a verification.
_EVIDENCE_STEPS = ("update", "flush", "verify")


def write(
    source,
    facts: Facts,
    *,
    cause: str,
    run=None,
    now: datetime | None = None,
    journal: Journal | None = None,
    known: Iterable[ServingInterval] | None = None,
) -> int:
    """Record `facts` for `source`; returns how many intervals were appended.

    `run` is the discovery behind the facts and `journal` the call rows behind each instance's
    (`refresh_journal`, `catch_up_journal`): both are stored on the intervals they append, so a
    provenance answer can point at the readback that proved it. `known`: the current intervals
    of the facts' namespaces (`current`), read by the caller in this transaction under the same
    gate locks, so they are not read twice; an instance missing from them has no interval."""
    if not facts:
        return 0
    now = now or timezone.now()
    lockorder.domain_lock("gates")  # the ledger is written under its gates' row locks
    if known is None:
        known = ServingInterval.objects.filter(
            source=source,
            valid_to__isnull=True,
            namespace__in={ns for ns, _ in facts},
            instance_id__in={iid for _, iid in facts},
        )
    existing = {(r.namespace, r.instance_id): r for r in known}
    ended: list[int] = []
    appended: list[ServingInterval] = []
    for (namespace, instance_id), change in facts.items():
        was = existing.get((namespace, instance_id))
        changes = change(was) if callable(change) else change
        if changes is None:
            continue
        values = {f: getattr(was, f) for f in _CARRIED} if was is not None else dict(_DEFAULTS)
        values.update(changes)
        if was is not None and all(getattr(was, f) == values[f] for f in _MEANING):
            continue
        if was is not None:
            ended.append(was.pk)
        appended.append(
            ServingInterval(
                source=source,
                namespace=namespace,
                instance_id=instance_id,
                valid_from=now,
                discovery_run=run,
                cause=(values.pop("cause", None) or cause)[:CAUSE_CHARS],
                journal_ids=list((journal or {}).get((namespace, instance_id), [])),
                **{k: v for k, v in values.items() if k in _CARRIED},
            )
        )
    _name_instances(source, [row for row in appended if not row.key])
    _mark_mixed(appended)
    if ended:
        ServingInterval.objects.filter(pk__in=ended).update(valid_to=now)
    # One COPY on PostgreSQL (`bulk.py`): a reopen appends an interval per instance, and
    # `bulk_create` spent more CPU assembling 2,000 rows' statement than anything else here.
    bulk.insert_objects(ServingInterval, appended)
    return len(appended)


def _name_instances(source, rows: list[ServingInterval]) -> None:
    """Give rows recorded by instance id alone their worker key (one query, whatever the
    number of rows)."""
    if not rows:
        return
    keys = {
        (ns, iid): worker_key(ns, component, endpoint, iid)
        for ns, component, endpoint, iid in Worker.objects.filter(
            source=source, instance_id__in={r.instance_id for r in rows}
        ).values_list("namespace", "component", "endpoint", "instance_id")
    }
    for row in rows:
        row.key = keys.get((row.namespace, row.instance_id), "")


def _mark_mixed(rows: list[ServingInterval]) -> None:
    """Mark as mixed the intervals verified by a refresh that declared requests in flight may
    straddle the update (`inflight_may_straddle`) for an instance it paused in a mode that keeps
    them: the window starts with requests begun on the old weights finishing on the new ones,
    samples that span two policies. One query for the refreshes, one for their workers, and
    none at all when no row was verified by a refresh."""
    verified = [r for r in rows if r.evidence == Evidence.VERIFIED_REFRESH and r.refresh_id]
    if not verified:
        return
    straddling = {
        pk: (target or {}).get("method", "")
        for pk, target in PolicyRefresh.objects.filter(
            pk__in={r.refresh_id for r in verified}, inflight_may_straddle=True
        ).values_list("pk", "target")
    }
    if not straddling:
        return
    kept: dict[tuple[int | None, str, str], str] = {
        (refresh_id, namespace, instance_id): mode
        for refresh_id, namespace, instance_id, mode in PlannedWorker.objects.filter(
            refresh_id__in=list(straddling)
        ).values_list("refresh_id", "namespace", "instance_id", "pause_mode")
        if straddling_modes(mode, None, straddling[refresh_id])
    }
    for row in verified:
        mode = kept.get((row.refresh_id, row.namespace, row.instance_id))
        if mode is not None:
            detail: EvidenceDetail = {
                **(row.evidence_detail or {}),
                "mixed": True,
                "in_flight": "kept",
                "pause_mode": mode,
            }
            row.evidence_detail = detail


# -- the facts ---------------------------------------------------------------------------------


def verified(
    refresh,
    version: Any,
    *,
    admitted: bool,
    key: str = "",
    detail: EvidenceDetail | None = None,
) -> Change:
    """Verified at `version` by `refresh` (readback, generation and agreement as it ran them);
    admitted when the gate takes it in now. An instance already verified at that version and
    admitted keeps its older evidence (a refresh of other instances did not re-verify it)."""

    def change(was: ServingInterval | None) -> Mapping[str, Any] | None:
        if (
            was is not None
            and was.verified
            and was.version == version
            and was.admitted
            and admitted
            and was.refresh_id != refresh.pk
            and was.transition_refresh_id is None
        ):
            return None
        out: dict[str, Any] = {
            "version": version,
            "evidence": Evidence.VERIFIED_REFRESH,
            "evidence_detail": dict(detail or {}) or verification_detail(refresh),
            "refresh_id": refresh.pk,
            "quarantine_id": None,
            "transition_refresh_id": None,
            "serving": Serving.SERVING,
            **_admission(Admission.VERIFIED if admitted else Admission.NOT_ADMITTED),
        }
        if key:
            out["key"] = key
        return out

    return change


def refresh_journal(
    refresh, instances: Iterable[tuple[str, str]]
) -> dict[tuple[str, str], list[int]]:
    """The journal rows behind each (namespace, instance)'s verification by `refresh`: its last
    successful call of each update, flush and verify operation. One query for any fleet size."""
    wanted = set(instances)
    if not wanted:
        return {}
    rows = JournalEntry.objects.filter(
        refresh=refresh,
        ok=True,
        step__in=_EVIDENCE_STEPS,
        planned_worker__instance_id__in={iid for _, iid in wanted},
    ).values_list(
        "planned_worker__namespace", "planned_worker__instance_id", "step", "operation", "pk"
    )
    return _collect(rows, wanted)


def catch_up_journal(quarantine) -> list[int]:
    """The call rows behind a catch-up's verification: the last successful call of each
    update, flush and verify operation of the quarantine."""
    rows = QuarantineCall.objects.filter(
        quarantine=quarantine, ok=True, step__in=_EVIDENCE_STEPS
    ).values_list("step", "operation", "pk")
    last: dict[tuple[str, str], int] = {}
    for step, operation, pk in rows:
        last[(step, operation)] = max(pk, last.get((step, operation), 0))
    return sorted(last.values())


def _collect(rows, wanted: set[tuple[str, str]]) -> dict[tuple[str, str], list[int]]:
    last: dict[tuple[str, str, str, str], int] = {}
    for namespace, instance_id, step, operation, pk in rows:
        if (namespace, instance_id) in wanted:
            slot = (namespace, instance_id, step, operation)
            last[slot] = max(pk, last.get(slot, 0))
    out: dict[tuple[str, str], list[int]] = {}
    for (namespace, instance_id, _, _), pk in last.items():
        out.setdefault((namespace, instance_id), []).append(pk)
    return {k: sorted(v) for k, v in out.items()}


def verification_detail(refresh) -> EvidenceDetail:
    """What a refresh's verify step checked (its `verification` flags)."""
    checks = refresh.verification or {}
    return {
        "readback": bool(checks.get("version_readback", True)),
        "generation": bool(checks.get("generation", False)),
        "agreement": (checks.get("agreement") or {}).get("kind", ""),
        "liveness": bool(checks.get("liveness", False)),
    }


def caught_up(quarantine, version: Any, *, key: str = "") -> Change:
    """Verified again, alone, by a quarantine catch-up (readback, generation, cross-check), and
    admitted back."""
    return {
        "key": key or quarantine.key,
        "version": version,
        "evidence": Evidence.VERIFIED_CATCH_UP,
        "evidence_detail": EvidenceDetail(readback=True, generation=True, agreement="cross-check"),
        "refresh_id": None,
        "quarantine_id": quarantine.pk,
        "transition_refresh_id": None,
        "serving": Serving.SERVING,
        **_admission(Admission.VERIFIED),
    }


def forced(version: Any, *, key: str, by: str, at: datetime, reason: str, evidence: str) -> Change:
    """Admitted by a person without verification, at the version its readback reports
    (`evidence` REPORTED), or the last one known when it has none (ASSUMED/UNKNOWN)."""
    return {
        "key": key,
        "version": version,
        "evidence": evidence,
        "evidence_detail": EvidenceDetail(readback=evidence == Evidence.REPORTED),
        "refresh_id": None,
        "quarantine_id": None,
        "transition_refresh_id": None,
        "serving": Serving.SERVING,
        "admission": Admission.FORCED,
        "forced_by": by[:200],
        "forced_at": at,
        "forced_reason": reason,
    }


def reported(version: Any, *, key: str = "", serving: str = Serving.SERVING) -> Change:
    """Seen serving `version` by its own readback, and not admitted (a joiner, a drifted
    worker). Verified evidence at the same version is kept: it only lost its admission."""

    def change(was: ServingInterval | None) -> Mapping[str, Any]:
        out: dict[str, Any] = {"serving": serving, **_admission(Admission.NOT_ADMITTED)}
        if key:
            out["key"] = key
        if was is None or was.version != version or not was.verified:
            out.update(
                version=version,
                evidence=Evidence.REPORTED if version is not None else Evidence.UNKNOWN,
                evidence_detail=EvidenceDetail(readback=version is not None),
                refresh_id=None,
                quarantine_id=None,
            )
        return out

    return change


def read_back(version: Any, *, key: str = "") -> Change:
    """An instance admitted without a readback (`unknown` evidence, a force-reopen that could
    read nothing back) now reads back `version`: its admission stands, at what it reports."""

    def change(was: ServingInterval | None) -> Mapping[str, Any] | None:
        if was is None or was.evidence != Evidence.UNKNOWN or version is None:
            return None
        out: dict[str, Any] = {
            "version": version,
            "evidence": Evidence.REPORTED,
            "evidence_detail": EvidenceDetail(readback=True),
        }
        if key:
            out["key"] = key
        return out

    return change


#: `withdrawn(transition=CLEAR)`: the refresh that was moving the instance is done with it.
CLEAR = object()


def withdrawn(*, serving: str | None = None, transition: Any = None) -> Change:
    """No longer admitted (its gate closed, it was paused for a wave, it drifted or was left
    out); what it serves is unchanged. `transition` names the refresh moving it (None: as it
    was; CLEAR: none)."""

    def change(was: ServingInterval | None) -> Mapping[str, Any] | None:
        if was is None:
            return None
        out: dict[str, Any] = _admission(Admission.NOT_ADMITTED)
        if serving is not None:
            out["serving"] = serving
        if transition is CLEAR:
            out["transition_refresh_id"] = None
        elif transition is not None:
            out["transition_refresh_id"] = transition.pk
        return out

    return change


def seen() -> Change:
    """A live instance the ledger did not know (a joiner): serving, version unknown, not
    admitted. An instance it knows is left as it is."""

    def change(was: ServingInterval | None) -> Mapping[str, Any] | None:
        return None if was is not None else {"serving": Serving.SERVING}

    return change


def readmitted(previous: ServingInterval) -> Change:
    """Admitted again on the grounds it had before a closure that has now been lifted."""
    return {
        "admission": previous.admission,
        "forced_by": previous.forced_by,
        "forced_at": previous.forced_at,
        "forced_reason": previous.forced_reason,
        "transition_refresh_id": None,
    }


class Readback(NamedTuple):
    """What one live instance reported when asked (`get_weight_version`) before a force-reopen:
    `evidence` REPORTED with its readback, or UNKNOWN (no readback route or no answer), when
    `version` is the last one discovery saw."""

    instance_id: str
    key: str
    version: Any
    evidence: str


def departed() -> Change:
    """It left the fleet (discovery no longer lists it)."""

    def change(was: ServingInterval | None) -> Mapping[str, Any] | None:
        if was is None or was.serving == Serving.DEPARTED:
            return None
        return {"serving": Serving.DEPARTED, **_admission(Admission.NOT_ADMITTED)}

    return change


def _admission(admission: str) -> dict[str, Any]:
    return {"admission": admission, "forced_by": "", "forced_at": None, "forced_reason": ""}
