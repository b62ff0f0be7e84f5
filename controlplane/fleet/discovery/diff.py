"""The membership diff: what changed between the last known workers and this observation.

Pure functions over small snapshots, so the rules (what counts as joined, left, changed,
started or stopped erroring) are unit-tested without a database or a network.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict

from controlplane.fleet.models import WorkerEventKind

#: Fields whose change is a membership change (audited); versions and liveness are not.
MEMBERSHIP_FIELDS = ("routes", "system_url", "model", "world_size")
#: How many worker keys an audit row lists per category before it only counts.
AUDIT_KEY_LIMIT = 50


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What the diff compares for one worker. `version_known` is False when the version probe
    did not answer, so an unreachable worker is not reported as changing version."""

    routes: tuple[str, ...] = ()
    system_url: str = ""
    model: str = ""
    world_size: int | None = None
    error: str = ""
    gone: bool = False
    weight_version: Any = None
    version_known: bool = False
    liveness: str = "unknown"

    @property
    def erroring(self) -> bool:
        return bool(self.error)


#: `WorkerEvent.details`, by the event's kind (this module owns its keys): a changed worker's
#: `fields` (field → `[old, new]`), the `error` it started reporting, or a version's or
#: liveness's `from` and `to` (a keyword, hence this form); empty for the other kinds.
WorkerEventDetails = TypedDict(
    "WorkerEventDetails",
    {"fields": dict[str, list[Any]], "error": str, "from": Any, "to": Any},
    total=False,
)


@dataclass(frozen=True, slots=True)
class Change:
    """One event for one worker, in the shape a `WorkerEvent` row stores."""

    key: str
    kind: WorkerEventKind
    details: WorkerEventDetails


@dataclass
class MembershipDiff:
    joined: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)
    changed: dict[str, dict[str, list[Any]]] = field(default_factory=dict)
    started_erroring: dict[str, str] = field(default_factory=dict)
    stopped_erroring: list[str] = field(default_factory=list)
    version_changed: dict[str, list[Any]] = field(default_factory=dict)
    liveness_changed: dict[str, list[str]] = field(default_factory=dict)

    @property
    def membership_changed(self) -> bool:
        """What gets audited: who is in the fleet, how to reach them, whether they work."""
        return bool(
            self.joined
            or self.left
            or self.changed
            or self.started_erroring
            or self.stopped_erroring
        )

    @property
    def touched(self) -> set[str]:
        """Every key whose row looks different now (for the live push)."""
        return {
            *self.joined,
            *self.left,
            *self.changed,
            *self.started_erroring,
            *self.stopped_erroring,
            *self.version_changed,
            *self.liveness_changed,
        }

    def changes(self) -> list[Change]:
        out = [Change(k, WorkerEventKind.JOINED, {}) for k in self.joined]
        out += [Change(k, WorkerEventKind.LEFT, {}) for k in self.left]
        out += [Change(k, WorkerEventKind.CHANGED, {"fields": f}) for k, f in self.changed.items()]
        out += [
            Change(k, WorkerEventKind.STARTED_ERRORING, {"error": e})
            for k, e in self.started_erroring.items()
        ]
        out += [Change(k, WorkerEventKind.STOPPED_ERRORING, {}) for k in self.stopped_erroring]
        out += [
            Change(k, WorkerEventKind.VERSION_CHANGED, {"from": old, "to": new})
            for k, (old, new) in self.version_changed.items()
        ]
        out += [
            Change(k, WorkerEventKind.LIVENESS_CHANGED, {"from": old, "to": new})
            for k, (old, new) in self.liveness_changed.items()
        ]
        return out

    def audit_details(self) -> dict[str, Any]:
        def keys(items) -> dict[str, Any]:
            items = sorted(items)
            return {"count": len(items), "keys": items[:AUDIT_KEY_LIMIT]}

        return {
            "joined": keys(self.joined),
            "left": keys(self.left),
            "changed": keys(self.changed),
            "started_erroring": keys(self.started_erroring),
            "stopped_erroring": keys(self.stopped_erroring),
        }


def diff_membership(
    previous: Mapping[str, Snapshot], observed: Mapping[str, Snapshot]
) -> MembershipDiff:
    """Compare last known workers (gone ones included) with this refresh's observation."""
    diff = MembershipDiff()
    for key, new in observed.items():
        old = previous.get(key)
        if old is None or old.gone:
            # A worker that comes back after leaving joins again: its history continues.
            diff.joined.append(key)
            if new.erroring:
                diff.started_erroring[key] = new.error
            continue
        fields = {
            name: [getattr(old, name), getattr(new, name)]
            for name in MEMBERSHIP_FIELDS
            if getattr(old, name) != getattr(new, name)
        }
        if fields:
            diff.changed[key] = {n: [_jsonable(a), _jsonable(b)] for n, (a, b) in fields.items()}
        if new.erroring and not old.erroring:
            diff.started_erroring[key] = new.error
        elif old.erroring and not new.erroring:
            diff.stopped_erroring.append(key)
        if old.version_known and new.version_known and old.weight_version != new.weight_version:
            diff.version_changed[key] = [old.weight_version, new.weight_version]
        if "unknown" not in (old.liveness, new.liveness) and old.liveness != new.liveness:
            diff.liveness_changed[key] = [old.liveness, new.liveness]
    for key, old in previous.items():
        if not old.gone and key not in observed:
            diff.left.append(key)
    return diff


def _jsonable(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value
