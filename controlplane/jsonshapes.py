"""Every JSON column of the project and its declared shape: `"app_label.Model.field"` → shape.

A shape is a `TypedDict` (the column's keys, owned by the module that defines it), an alias of
a plain list or mapping, or `OpaqueJson` for outside data kept verbatim; `| None` where the
column is nullable. `tests/unit/test_json_shapes.py` fails when a model has a `JSONField` that
is not listed here, and `tests/integration/test_json_shapes_conform.py` checks the rows a
realistic scenario writes against these shapes with `problems`, the small runtime validator
below.

This module sits above every app (it imports them all) and nothing but tests imports it.
"""

from __future__ import annotations

import types
from typing import (
    Any,
    NotRequired,
    Required,
    TypeAliasType,
    Union,
    get_args,
    get_origin,
    get_type_hints,
    is_typeddict,
)

from controlplane.analysis.spec import TemplateBody
from controlplane.dynamo.fingerprint import FingerprintJson
from controlplane.dynamo.listing import ListenerTransport
from controlplane.fleet.discovery.diff import WorkerEventDetails
from controlplane.fleet.discovery.rejections import RejectedEntryJson
from controlplane.fleet.serving_health import ServingModels
from controlplane.fleet.validation import DeclaredFamilies
from controlplane.intake.services.endpoints import Secrets
from controlplane.intake.webhooks.trainer.events import ApprovalRule, WebhookResponse
from controlplane.jsontypes import (
    Blockers,
    Empty,
    EventNames,
    InstanceIds,
    JournalIds,
    Namespaces,
    Networks,
    OpaqueJson,
    Routes,
    WeightVersion,
    WorkerKeys,
)
from controlplane.refresh.compat_record import CompatRecord
from controlplane.refresh.gates import AdmittedEntry, DriftEntry, InstanceSets
from controlplane.refresh.handshake import Group
from controlplane.refresh.ledger import EvidenceDetail
from controlplane.refresh.membership import MembershipChange
from controlplane.refresh.models.analysis import AnalysisReport
from controlplane.refresh.namespaces import ResolvedNamespaces
from controlplane.refresh.planning.verification import Verification
from controlplane.refresh.planning.worker import PlannedCalls
from controlplane.refresh.progress import Progress
from controlplane.refresh.strategy import StrategyJson
from controlplane.refresh.targets import DrillPolicy, PauseModes, Target

SHAPES: dict[str, Any] = {
    # -- audit: what each action records is its own business, hashed into the chain as written.
    "audit.AuditEvent.details": OpaqueJson,
    # -- notify
    "notify.NotificationDestination.allowed_networks": Networks,
    "notify.NotificationDestination.events": EventNames,
    # The message body as sent to a destination (each event's payload, plus its envelope).
    "notify.NotificationDelivery.payload": OpaqueJson,
    # -- fleet
    "fleet.Source.allowed_networks": Networks,
    "fleet.Source.default_strategy": StrategyJson,
    "fleet.Source.declared_families": DeclaredFamilies,
    "fleet.StaticWorker.allowed_routes": Routes,
    "fleet.Worker.transport": ListenerTransport,
    "fleet.Worker.routes": Routes,
    "fleet.Worker.weight_version": WeightVersion | None,
    "fleet.DiscoveryRun.rejected_entries": list[RejectedEntryJson],
    "fleet.WorkerEvent.details": WorkerEventDetails,
    "fleet.PublishedPolicy.version": WeightVersion,
    "fleet.PublishedPolicy.namespaces": Namespaces,
    "fleet.PublishedPolicy.lag_alerted": Namespaces,
    "fleet.ServingHealthPoint.by_model": ServingModels,
    # -- analysis
    "analysis.AnalysisTemplate.body": TemplateBody,
    # -- refresh: drills
    "refresh.CanaryAnalysis.report": AnalysisReport,
    "refresh.DrillRun.namespaces": Namespaces,
    "refresh.DrillRun.instances": InstanceIds,
    "refresh.DrillRun.current_policy": DrillPolicy,
    "refresh.DrillRun.previous_policy": DrillPolicy,
    # -- refresh: the serving ledger
    "refresh.ServingInterval.version": WeightVersion | None,
    "refresh.ServingInterval.evidence_detail": EvidenceDetail,
    "refresh.ServingInterval.journal_ids": JournalIds,
    # -- refresh: gates
    "refresh.Gate.admitted": list[AdmittedEntry],
    "refresh.Gate.verified_version": WeightVersion | None,
    "refresh.Gate.verified_policy": Target | None,
    "refresh.Gate.verified_instances": InstanceIds,
    "refresh.Gate.drift": list[DriftEntry],
    "refresh.Gate.instance_sets": InstanceSets,
    # -- refresh: a policy refresh
    "refresh.PolicyRefresh.namespaces": Namespaces,
    "refresh.PolicyRefresh.worker_keys": WorkerKeys | None,
    "refresh.PolicyRefresh.target": Target,
    "refresh.PolicyRefresh.pause_modes": PauseModes,
    "refresh.PolicyRefresh.verification": Verification,
    "refresh.PolicyRefresh.fingerprint": FingerprintJson | None,
    "refresh.PolicyRefresh.plan_blockers": Blockers,
    "refresh.PolicyRefresh.plan_membership": WorkerKeys,
    "refresh.PolicyRefresh.membership_change": MembershipChange,
    "refresh.PolicyRefresh.left_out": WorkerKeys,
    "refresh.PolicyRefresh.resolved_namespaces": ResolvedNamespaces,
    "refresh.PolicyRefresh.group": Group,
    "refresh.PolicyRefresh.compat": CompatRecord | Empty,
    "refresh.PolicyRefresh.strategy": StrategyJson,
    "refresh.PolicyRefresh.instances": InstanceIds | None,
    "refresh.PolicyRefresh.progress": Progress,
    "refresh.PlannedWorker.calls": PlannedCalls,
    "refresh.PlannedWorker.blockers": Blockers,
    # Bodies sent to and answered by workers, as they went over the wire.
    "refresh.JournalEntry.request_body": OpaqueJson,
    "refresh.JournalEntry.response_body": OpaqueJson,
    "refresh.Quarantine.target": Target | None,
    "refresh.QuarantineCall.request_body": OpaqueJson,
    "refresh.QuarantineCall.response_body": OpaqueJson,
    # -- intake
    # The API answer kept for an idempotent repeat (any endpoint's body, replayed as given).
    "intake.IdempotencyRecord.response_body": OpaqueJson,
    "intake.WebhookEndpoint.namespaces": Namespaces,
    "intake.WebhookEndpoint.secrets": Secrets,
    "intake.WebhookEndpoint.rules": list[ApprovalRule],
    "intake.WebhookEndpoint.default_strategy": StrategyJson,
    # The trainer's signed envelope, as received.
    "intake.ReceivedWebhook.payload": OpaqueJson,
    "intake.ReceivedWebhook.response": WebhookResponse,
}


# -- the validator ------------------------------------------------------------------------------
_SIMPLE: dict[Any, tuple[type, ...]] = {
    str: (str,),
    int: (int,),
    float: (int, float),
    bool: (bool,),
    dict: (dict,),
    list: (list,),
}


def problems(value: Any, shape: Any, path: str = "$") -> list[str]:
    """What in `value` does not fit `shape` (empty: it fits).

    A `TypedDict` needs its required keys, allows no other key and checks each value; a list
    or mapping alias checks its elements; `str`, `int`, `float`, `bool`, None, `list` and
    `dict` are checked by JSON type (a bool is not a number); `Any` and `OpaqueJson` (outside
    data kept verbatim) are not looked into; a union fits when one of its members does.
    """
    if shape is OpaqueJson or shape is Any:
        return []
    if isinstance(shape, TypeAliasType):
        return problems(value, shape.__value__, path)
    origin = get_origin(shape)
    if origin in (Required, NotRequired):
        return problems(value, get_args(shape)[0], path)
    if origin in (Union, types.UnionType):
        found = [problems(value, member, path) for member in get_args(shape)]
        if any(not p for p in found):
            return []
        return min(found, key=len)
    if shape is None or shape is type(None):
        return [] if value is None else [f"{path}: expected null, got {_kind(value)}"]
    if is_typeddict(shape):
        return _typeddict_problems(value, shape, path)
    if origin is list:
        if not isinstance(value, list):
            return [f"{path}: expected a list, got {_kind(value)}"]
        (item,) = get_args(shape)
        return [p for i, v in enumerate(value) for p in problems(v, item, f"{path}[{i}]")]
    if origin is dict:
        if not isinstance(value, dict):
            return [f"{path}: expected an object, got {_kind(value)}"]
        _key, item = get_args(shape)
        out = [f"{path}: key {k!r} is not text" for k in value if not isinstance(k, str)]
        return out + [p for k, v in value.items() for p in problems(v, item, f"{path}.{k}")]
    if shape in _SIMPLE:
        ok = isinstance(value, _SIMPLE[shape]) and (shape is bool or not isinstance(value, bool))
        return [] if ok else [f"{path}: expected {shape.__name__}, got {_kind(value)}"]
    raise TypeError(f"{path}: the validator cannot check the shape {shape!r}")


def _typeddict_problems(value: Any, shape: Any, path: str) -> list[str]:
    if not isinstance(value, dict):
        return [f"{path}: expected a {shape.__name__} object, got {_kind(value)}"]
    hints = get_type_hints(shape, include_extras=True)
    required = {k for k, hint in hints.items() if _required(shape, k, hint)}
    out = [f"{path}: {shape.__name__} needs {k!r}" for k in sorted(required - set(value))]
    out += [f"{path}: {shape.__name__} has no key {k!r}" for k in sorted(set(value) - set(hints))]
    for key, item in value.items():
        if key in hints:
            out += problems(item, hints[key], f"{path}.{key}")
    return out


def _required(shape: Any, key: str, hint: Any) -> bool:
    """Whether a TypedDict key is required: `Required`/`NotRequired`, else the totality of the
    class that declares it (`__required_keys__` misses the qualifiers of postponed
    annotations, which every module here uses)."""
    if get_origin(hint) is Required:
        return True
    if get_origin(hint) is NotRequired:
        return False
    return bool(_declaring(shape, key).__total__)


def _declaring(shape: Any, key: str) -> Any:
    """The TypedDict, among `shape` and its TypedDict bases, that declares `key`."""
    for base in getattr(shape, "__orig_bases__", ()):
        if is_typeddict(base) and key in base.__annotations__:
            return _declaring(base, key)
    return shape


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__
