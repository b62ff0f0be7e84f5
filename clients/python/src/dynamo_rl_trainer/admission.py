"""Where the guard learns whether an instance was admitted at a version: the serving ledger's
provenance answer when the control plane has one, the gate otherwise.

- `LedgerView` asks `GET /api/v1/provenance?instance_id=<id>&at=<ISO time>`, which answers
  what the instance served at that moment: `{"weight_version": V, "admitted": true|false, ...}`.
  That is the exact question ("was it admitted at the stamped version *when the request was
  sent*"), so a worker that restarted at base weights and caught up later is still refused
  for the samples it produced in between.
- `GateView` is the fallback while a server has no ledger: the gate *now*. An instance is
  admitted when the gate is open at the stamped version, lists the instance as verified, and
  has been open since before the request was sent. Run the guard right after generation: a
  gate read later may admit an instance that caught up after serving the sample.

`ControlPlane.admission_view()` picks the ledger when the server's OpenAPI schema lists the
provenance route, the gate otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

from dynamo_rl_trainer.errors import NotFound
from dynamo_rl_trainer.results import AdmittedInstances, WorkerIdentity, same_version

if TYPE_CHECKING:
    from dynamo_rl_trainer.control import ControlPlane


@dataclass(frozen=True)
class Admission:
    """Whether the instance was admitted at the version; `reason` says why not, `basis` which
    record answered (`ledger` or `gate`)."""

    admitted: bool
    reason: str
    basis: str


class AdmissionView(Protocol):
    def admission(self, instance_id: int, version: Any, at: float) -> Admission: ...

    def identity(self, instance_id: int) -> WorkerIdentity | None: ...


class GateView:
    """The gate as read now (see the module docstring for what that can and cannot prove)."""

    basis = "gate"

    def __init__(self, admitted: AdmittedInstances, *, allow_forced: bool = False) -> None:
        self.admitted = admitted
        self.allow_forced = allow_forced
        self._identities = {w.instance_id: w for w in admitted.instances}

    def admission(self, instance_id: int, version: Any, at: float) -> Admission:
        gate = self.admitted.gate
        where = f"gate {gate.source}/{gate.namespace}"
        if not gate.admits(version, allow_forced=self.allow_forced):
            return Admission(
                False,
                f"{where} is {gate.state} at {gate.verified_version!r}, not open at {version!r}",
                self.basis,
            )
        if instance_id not in gate.verified_instances:
            return Admission(
                False,
                f"instance {instance_id} is not verified at {version!r} ({where})",
                self.basis,
            )
        if gate.since is not None and at < gate.since:
            return Admission(
                False,
                f"the request was sent before {where} opened at {version!r}",
                self.basis,
            )
        return Admission(True, "", self.basis)

    def identity(self, instance_id: int) -> WorkerIdentity | None:
        return self._identities.get(instance_id)


#: Ledger confidences under which an admitted interval names exactly the version served.
ADMITTING_CONFIDENCE = ("verified", "forced")


class LedgerView:
    """The serving ledger's answer for the instance at the request's time."""

    basis = "ledger"

    def __init__(self, control: ControlPlane, identities: dict[int, WorkerIdentity]) -> None:
        self.control = control
        self._identities = identities

    def admission(self, instance_id: int, version: Any, at: float) -> Admission:
        when = datetime.fromtimestamp(at, tz=UTC).isoformat()
        try:
            answer = self.control.provenance(instance_id, when)
        except NotFound:
            return Admission(
                False, f"the serving ledger has no record of instance {instance_id}", self.basis
            )
        # Every ledger interval of the instance that overlaps the moment (two at a boundary)
        # must admit it at the stamped version: verified, or forced by an approver.
        intervals = answer.get("intervals") or []
        if not intervals:
            return Admission(
                False,
                f"the serving ledger has no interval of instance {instance_id} at {when}",
                self.basis,
            )
        for interval in intervals:
            if not interval.get("admitted"):
                state = f"{interval.get('serving')}, {interval.get('confidence')}"
                return Admission(
                    False, f"instance {instance_id} at {when}: not admitted ({state})", self.basis
                )
            served = interval.get("version")
            if interval.get("confidence") not in ADMITTING_CONFIDENCE or not same_version(
                served, version
            ):
                return Admission(
                    False,
                    f"instance {instance_id} served {interval.get('versions')!r} at {when} "
                    f"({interval.get('confidence')}), not {version!r}",
                    self.basis,
                )
        return Admission(True, "", self.basis)

    def identity(self, instance_id: int) -> WorkerIdentity | None:
        return self._identities.get(instance_id)
