"""Fleet actions: one function per intent, each writing its change and its audit row in one
transaction. Views, commands, the API and tasks call these; they never write models directly.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from controlplane import jobs
from controlplane.audit.actions import AuditAction
from controlplane.audit.recorder import Actor, record
from controlplane.fleet import live
from controlplane.fleet.models import (
    DiscoveryTrigger,
    Source,
    StaticWorker,
    Worker,
    WorkerState,
)
from controlplane.fleet.validation import (
    AGREEMENT_DEFAULTS,
    DEFAULT_DRIFT_POLICY,
    DEFAULT_MAX_LAG_ACTION,
    DEFAULT_MAX_LAG_STEPS,
    SOURCE_FIELDS,
    clean_source_values,
    clean_static_worker_values,
)

#: The discovery task, sent by name (`controlplane.jobs`): nothing here imports the tasks module.
RUN_DISCOVERY_TASK = "fleet.run_discovery"


def _source_values(source: Source) -> dict[str, Any]:
    return {field: getattr(source, field) for field in SOURCE_FIELDS}


def _name_taken(name: str, *, exclude_pk: int | None = None) -> bool:
    taken = Source.objects.filter(name=name)
    if exclude_pk is not None:
        taken = taken.exclude(pk=exclude_pk)
    return taken.exists()


def create_source(
    *,
    actor: Actor,
    name: str,
    listener_url: str,
    frontend_url: str = "",
    expected_namespace: str = "",
    expected_prefix: str = "",
    expected_worker_suffix: str = "",
    listener_scope: str = "",
    allowed_networks=(),
    discovery_interval_seconds: float = 10.0,
    require_approval: bool = False,
    enabled: bool = True,
    agreement_rule: str = AGREEMENT_DEFAULTS["agreement_rule"],
    agreement_tokens: int = AGREEMENT_DEFAULTS["agreement_tokens"],
    agreement_epsilon: float = AGREEMENT_DEFAULTS["agreement_epsilon"],
    drift_policy: str = DEFAULT_DRIFT_POLICY,
    drill_every: int = 0,
    declared_family: str = "",
    declared_families: dict[str, str] | None = None,
    dynamo_release: str = "",
    max_lag_action: str = DEFAULT_MAX_LAG_ACTION,
    max_lag_steps: int = DEFAULT_MAX_LAG_STEPS,
) -> Source:
    """Register a source. Raises ValidationError (keyed by field) and changes nothing on bad
    input."""
    values = clean_source_values(
        {
            "name": name,
            "listener_url": listener_url,
            "frontend_url": frontend_url,
            "expected_namespace": expected_namespace,
            "expected_prefix": expected_prefix,
            "expected_worker_suffix": expected_worker_suffix,
            "listener_scope": listener_scope,
            "allowed_networks": allowed_networks,
            "discovery_interval_seconds": discovery_interval_seconds,
            "require_approval": require_approval,
            "enabled": enabled,
            "agreement_rule": agreement_rule,
            "agreement_tokens": agreement_tokens,
            "agreement_epsilon": agreement_epsilon,
            "drift_policy": drift_policy,
            "drill_every": drill_every,
            "declared_family": declared_family,
            "declared_families": declared_families or {},
            "dynamo_release": dynamo_release,
            "max_lag_action": max_lag_action,
            "max_lag_steps": max_lag_steps,
        }
    )
    if _name_taken(values["name"]):
        raise ValidationError({"name": f"a source named {values['name']!r} already exists"})
    try:
        with transaction.atomic():
            source = Source.objects.create(**values)
            record(
                AuditAction.SOURCE_CREATED, actor=actor, target=source, details={"values": values}
            )
    except IntegrityError:  # lost a race with a concurrent create of the same name
        taken = f"a source named {values['name']!r} already exists"
        raise ValidationError({"name": taken}) from None
    transaction.on_commit(lambda: live.publish_overview())
    return source


def update_source(source: Source, *, actor: Actor, **changes: Any) -> Source:
    """Change some of a source's settings. Unknown fields and bad values change nothing."""
    before = _source_values(source)
    values = clean_source_values({**before, **changes})
    if values["name"] != source.name and _name_taken(values["name"], exclude_pk=source.pk):
        raise ValidationError({"name": f"a source named {values['name']!r} already exists"})
    changed = {k: [before[k], v] for k, v in values.items() if before[k] != v}
    if not changed:
        return source
    with transaction.atomic():
        for field, (_, new) in changed.items():
            setattr(source, field, new)
        source.save(update_fields=[*changed, "updated_at"])
        record(AuditAction.SOURCE_UPDATED, actor=actor, target=source, details={"changed": changed})
    transaction.on_commit(lambda: live.publish_overview())
    return source


def remove_source(source: Source, *, actor: Actor) -> None:
    """Delete a source with its workers and history; the audit row keeps what it was."""
    details = {"values": _source_values(source), "workers": source.workers.count()}
    target = ("fleet.source", source.pk, source.name)
    with transaction.atomic():
        source.delete()
        record(AuditAction.SOURCE_REMOVED, actor=actor, target=target, details=details)
    transaction.on_commit(lambda: live.publish_overview())


def add_static_worker(
    source: Source,
    *,
    actor: Actor,
    name: str,
    namespace: str,
    system_url: str,
    family: str,
    allowed_routes,
    component: str = "backend",
    model: str = "",
    endpoint: str = "generate",
    declared_instance_id: str = "",
) -> StaticWorker:
    """Register a worker discovery does not report; the next refresh probes it."""
    values = clean_static_worker_values(
        {
            "name": name,
            "namespace": namespace,
            "system_url": system_url,
            "family": family,
            "allowed_routes": allowed_routes,
            "component": component,
            "model": model,
            "endpoint": endpoint,
            "declared_instance_id": declared_instance_id,
        },
        allowed_networks=source.allowed_networks,
    )
    if source.static_workers.filter(name=values["name"]).exists():
        raise ValidationError({"name": f"static worker {values['name']!r} already exists"})
    with transaction.atomic():
        static = StaticWorker.objects.create(source=source, **values)
        record(
            AuditAction.STATIC_WORKER_ADDED,
            actor=actor,
            target=static,
            details={"source": source.name, "values": values},
        )
    return static


def remove_static_worker(static_worker: StaticWorker, *, actor: Actor) -> None:
    """Forget a static worker. Its worker row is marked gone (kept for history), not deleted."""
    source = static_worker.source
    now = timezone.now()
    with transaction.atomic():
        Worker.objects.filter(static_worker=static_worker).exclude(state=WorkerState.GONE).update(
            state=WorkerState.GONE, gone_at=now
        )
        details = {"source": source.name, "name": static_worker.name}
        target = ("fleet.staticworker", static_worker.pk, str(static_worker))
        static_worker.delete()
        record(AuditAction.STATIC_WORKER_REMOVED, actor=actor, target=target, details=details)


def request_discovery(source: Source, *, actor: Actor) -> None:
    """Ask for a discovery now ("Run discovery"); it runs on a Celery worker after commit."""
    with transaction.atomic():
        record(AuditAction.DISCOVERY_REQUESTED, actor=actor, target=source)
        jobs.enqueue(
            RUN_DISCOVERY_TASK,
            source.pk,
            DiscoveryTrigger.MANUAL.value,
            expires=max(source.discovery_interval_seconds, 30.0),
        )
