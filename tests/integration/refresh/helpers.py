"""Shared helpers for refresh integration tests: sources over a simulated fleet, waiting."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
from django.utils import timezone

from controlplane.audit.recorder import Actor
from controlplane.dynamo.discovery import parse_discovery
from controlplane.dynamo.families import detect_family
from controlplane.fleet.models import Source, Worker, WorkerState
from controlplane.refresh import actions
from controlplane.refresh.executor import execute_refresh
from controlplane.refresh.models import PolicyRefresh
from controlplane.simfleet import FleetConfig

NAMESPACES = ("rl-a", "rl-b", "rl-c")


def fleet_config(workers: int = 12, **kwargs) -> FleetConfig:
    return FleetConfig.generate(
        workers=workers,
        namespaces=NAMESPACES,
        prefix="rl",
        seed=kwargs.pop("seed", 7),
        listener_env={"DYN_RL_REQUEST_TIMEOUT_SECS": "2"},
        **kwargs,
    )


def make_source(fleet, name: str = "sim", **fields) -> Source:
    return Source.objects.create(
        name=name,
        listener_url=fleet.listener_url,
        frontend_url=fleet.frontend_url,
        expected_prefix="rl",
        allowed_networks=["127.0.0.0/8"],
        **fields,
    )


def sync_workers(source: Source) -> None:
    """What discovery does for the planner, for when the fleet app's discovery is absent.

    Upserts Worker rows from the listener and marks missing ones gone.
    """
    try:
        from controlplane.fleet import discovery
        from controlplane.fleet.models import DiscoveryTrigger
    except ImportError:
        pass
    else:
        discovery.refresh_source(source.pk, trigger=DiscoveryTrigger.MANUAL)
        return
    result = parse_discovery(httpx.get(source.listener_url + "/v1/rl/workers").content)
    now = timezone.now()
    seen = set()
    for w in result.workers:
        family = detect_family(w.routes)
        row, _ = Worker.objects.update_or_create(
            source=source,
            namespace=w.identity.namespace,
            component=w.identity.component,
            endpoint=w.identity.endpoint,
            instance_id=str(w.identity.instance_id),
            defaults={
                "family": family.name if family else "",
                "system_url": w.system_url or "",
                "routes": list(w.routes),
                "model": w.model or "",
                "error": w.error or "",
                "state": WorkerState.ERRORING if w.error else WorkerState.LIVE,
                "first_seen_at": now,
                "last_seen_at": now,
                "gone_at": None,
            },
        )
        seen.add(row.pk)
    Worker.objects.filter(source=source).exclude(pk__in=seen).update(
        state=WorkerState.GONE, gone_at=now
    )


def actor_for(user) -> Actor:
    return Actor.for_user(user)


def plan(source, user, version="v2", **kwargs) -> PolicyRefresh:
    sync_workers(source)
    return actions.plan_policy_refresh(
        source=source,
        actor=actor_for(user),
        target={"weight_version": version, "method": "disk", "model_path": f"/ckpt/{version}"},
        **kwargs,
    )


def run_inline(source, user, version="v2", **kwargs) -> PolicyRefresh:
    """Plan, start without Celery, and execute in this thread; returns the refreshed row."""
    refresh = plan(source, user, version, **kwargs)
    assert not refresh.plan_blockers, refresh.plan_blockers
    actions.start_policy_refresh(refresh, actor=actor_for(user), enqueue=False)
    execute_refresh(refresh.pk)
    refresh.refresh_from_db()
    return refresh


def wait_for(predicate: Callable[[], object], timeout: float = 30.0, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")


def fleet_versions(fleet) -> dict[str, object]:
    return {w["identity"]: w["version"] for w in fleet.workers()}


def paused_workers(fleet) -> list[str]:
    return [w["key"] for w in fleet.workers() if w.get("paused")]
