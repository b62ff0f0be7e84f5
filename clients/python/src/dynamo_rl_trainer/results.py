"""Typed results of the control plane's answers. Instance ids are Python ints (Dynamo's u64
ids travel as decimal strings in the API, since JSON numbers cannot carry them exactly)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

#: Delivery outcomes after which no refresh will run for the checkpoint.
REFUSED_OUTCOMES = frozenset({"plan_blocked", "failed", "superseded"})


def parse_time(value: Any) -> float | None:
    """An ISO-8601 timestamp from the API as Unix seconds (None stays None)."""
    if not isinstance(value, str) or not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def same_version(a: Any, b: Any) -> bool:
    """Versions compare as the server stores them, and `1200` equals `"1200"` (the API lets a
    version be sent as either)."""
    if a is None or b is None:
        return a is b
    return a == b or str(a) == str(b)


@dataclass(frozen=True)
class WebhookAnswer:
    """The control plane's answer to one signed webhook."""

    http_status: int
    status: str
    webhook_id: str
    outcome: str
    delivery_id: int | None = None
    state: str | None = None
    refresh_id: int | None = None
    detail: str | None = None
    queued: bool | None = None
    recovery: str | None = None
    group: dict[str, Any] | None = None
    canary: dict[str, Any] | None = None
    external: dict[str, Any] | None = None

    @classmethod
    def from_json(cls, http_status: int, body: dict[str, Any]) -> WebhookAnswer:
        return cls(
            http_status=http_status,
            status=str(body.get("status", "")),
            webhook_id=str(body.get("webhook_id", "")),
            outcome=str(body.get("outcome", "")),
            delivery_id=body.get("delivery_id"),
            state=body.get("state"),
            refresh_id=body.get("refresh_id"),
            detail=body.get("detail"),
            queued=body.get("queued"),
            recovery=body.get("recovery"),
            group=body.get("group"),
            canary=body.get("canary"),
            external=body.get("external"),
        )


@dataclass(frozen=True)
class Delivery:
    """`GET /api/v1/webhooks/deliveries/<webhook-id>`: what became of a checkpoint."""

    webhook_id: str
    state: str
    terminal: bool
    outcome: str
    refresh_id: int | None
    refresh_state: str | None
    attempts: int
    last_error: str | None
    detail: str | None

    @property
    def refused(self) -> bool:
        return self.terminal and self.outcome in REFUSED_OUTCOMES

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Delivery:
        return cls(
            webhook_id=str(body.get("webhook_id", "")),
            state=str(body.get("state", "")),
            terminal=bool(body.get("terminal")),
            outcome=str(body.get("outcome", "")),
            refresh_id=body.get("refresh_id"),
            refresh_state=body.get("refresh_state"),
            attempts=int(body.get("attempts") or 0),
            last_error=body.get("last_error") or None,
            detail=body.get("detail") or None,
        )


@dataclass(frozen=True)
class Gate:
    """One scope's gate: open at a verified version to a set of verified instances."""

    source: str
    namespace: str
    state: str
    open: bool
    verified_version: Any
    verified_instances: tuple[int, ...]
    since: float | None
    reason: str
    revision: int
    active_refresh_id: int | None
    etag: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def verified(self) -> bool:
        """Open because the fleet was verified (not forced open by a person)."""
        return self.state == "open"

    def admits(self, version: Any, *, allow_forced: bool = False) -> bool:
        """Rollouts at `version` may flow: verified open (or forced, if allowed) at it."""
        opened = self.verified or (allow_forced and self.state == "open_forced")
        return opened and same_version(self.verified_version, version)

    @classmethod
    def from_json(cls, body: dict[str, Any], etag: str | None = None) -> Gate:
        return cls(
            source=str(body["source"]),
            namespace=str(body["namespace"]),
            state=str(body["state"]),
            open=bool(body["open"]),
            verified_version=body.get("verified_version"),
            verified_instances=tuple(int(i) for i in body.get("verified_instances") or ()),
            since=parse_time(body.get("since")),
            reason=str(body.get("reason") or ""),
            revision=int(body.get("revision") or 0),
            active_refresh_id=body.get("active_refresh_id"),
            etag=etag,
            raw=body,
        )


@dataclass(frozen=True)
class WorkerIdentity:
    """What discovery knows of one serving instance: the model it registered and, where the
    deployment records one, its tokenizer identity."""

    instance_id: int
    namespace: str
    model: str
    tokenizer: str | None = None
    weight_version: Any = None


@dataclass(frozen=True)
class AdmittedInstances:
    """The instances a gate admits at its verified version, with their identities."""

    gate: Gate
    instances: tuple[WorkerIdentity, ...]

    @property
    def version(self) -> Any:
        return self.gate.verified_version

    @property
    def instance_ids(self) -> tuple[int, ...]:
        return tuple(w.instance_id for w in self.instances)


#: Refresh states after which its group will not move again.
ENDED_REFRESH_STATES = frozenset(
    {"succeeded", "held", "failed", "aborted", "rejected", "rolled_back"}
)


@dataclass(frozen=True)
class GroupView:
    """A distributed refresh's weight-update group, as the trainer sees it."""

    refresh_id: int
    refresh_state: str
    state: str
    attempt: int | None
    world_size: int | None
    weight_version: Any
    reason: str

    @property
    def ended(self) -> bool:
        return self.refresh_state in ENDED_REFRESH_STATES

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> GroupView:
        return cls(
            refresh_id=int(body["refresh_id"]),
            refresh_state=str(body.get("refresh_state", "")),
            state=str(body.get("state") or ""),
            attempt=body.get("attempt"),
            world_size=body.get("world_size"),
            weight_version=body.get("weight_version"),
            reason=str(body.get("reason") or ""),
        )


@dataclass(frozen=True)
class ApplyWorker:
    """One paused worker an external refresh asks the trainer to apply the weights to."""

    instance_id: int | None
    namespace: str
    key: str
    family: str
    #: The worker's admin URL (its system server), for a framework that loads through it.
    system_url: str

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> ApplyWorker:
        raw = str(body.get("instance_id") or "")
        return cls(
            instance_id=int(raw) if raw.isdigit() else None,
            namespace=str(body.get("namespace") or ""),
            key=str(body.get("key") or ""),
            family=str(body.get("family") or ""),
            system_url=str(body.get("system_url") or ""),
        )


#: The refresh state in which an external refresh waits for the trainer's `applied` report.
AWAITING_APPLY = "awaiting_apply"


@dataclass(frozen=True)
class ApplyRequest:
    """An external refresh's wait for the trainer (`refresh.ready_for_apply`, `GET
    /refreshes/<id>/external`): the paused workers to apply `weight_version` to, the deadline,
    and which of them reported `applied` so far."""

    refresh_id: int
    refresh_state: str
    weight_version: Any
    state: str
    attempt: int | None
    deadline: float | None
    workers: tuple[ApplyWorker, ...]
    applied: tuple[str, ...]
    missing: tuple[str, ...]
    reason: str

    @property
    def awaiting(self) -> bool:
        """The workers are paused and the refresh waits for the report now."""
        return self.refresh_state == AWAITING_APPLY and self.state == "awaiting"

    @property
    def ended(self) -> bool:
        """The refresh stopped (held, ended): no report is taken until a person acts."""
        return self.refresh_state in ENDED_REFRESH_STATES

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> ApplyRequest:
        return cls(
            refresh_id=int(body["refresh_id"]),
            refresh_state=str(body.get("refresh_state", "")),
            weight_version=body.get("weight_version"),
            state=str(body.get("state") or ""),
            attempt=body.get("attempt"),
            deadline=parse_time(body.get("deadline")),
            workers=tuple(ApplyWorker.from_json(w) for w in body.get("workers") or ()),
            applied=tuple(str(i) for i in body.get("applied") or ()),
            missing=tuple(str(i) for i in body.get("missing") or ()),
            reason=str(body.get("reason") or ""),
        )
