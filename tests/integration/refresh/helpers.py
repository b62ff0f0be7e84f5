"""Shared helpers for refresh integration tests: sources over a simulated fleet, waiting."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from django.db import connection

from controlplane.audit.recorder import Actor
from controlplane.fleet import discovery
from controlplane.fleet.models import DiscoveryTrigger, Source
from controlplane.refresh import intents
from controlplane.refresh.executor import execute_refresh
from controlplane.refresh.models import Gate, PolicyRefresh, RefreshState
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
    values = {
        "listener_url": fleet.listener_url,
        "frontend_url": fleet.frontend_url,
        "expected_prefix": "rl",
        "allowed_networks": ["127.0.0.0/8"],
    }
    return Source.objects.create(name=name, **{**values, **fields})


def sync_workers(source: Source) -> None:
    """A discovery refresh, so the planner's "last view" matches the fleet."""
    discovery.run_discovery(source.pk, trigger=DiscoveryTrigger.MANUAL, wait=15)


def actor_for(user) -> Actor:
    return Actor.for_user(user)


def plan(source, user, version="v2", target=None, **kwargs) -> PolicyRefresh:
    """A disk update to `version` unless another `target` is given."""
    sync_workers(source)
    return intents.plan_policy_refresh(
        source=source,
        actor=actor_for(user),
        target=target
        or {"weight_version": version, "method": "disk", "model_path": f"/ckpt/{version}"},
        **kwargs,
    )


def run_inline(source, user, version="v2", **kwargs) -> PolicyRefresh:
    """Plan, start without Celery, and execute in this thread; returns the refreshed row."""
    refresh = plan(source, user, version, **kwargs)
    assert not refresh.plan_blockers, refresh.plan_blockers
    intents.start_policy_refresh(refresh, actor=actor_for(user), enqueue=False)
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


def force_reopen_each(refresh, user, reason="force-reopened namespace by namespace"):
    """Force-reopen every namespace the refresh still holds, one by one, running the executor
    after each (it resumes that namespace's engines and holds again, or ends after the last)."""
    while gate := Gate.objects.filter(active_refresh=refresh).order_by("namespace").first():
        intents.force_reopen_gate(gate, actor=actor_for(user), reason=reason)
        execute_refresh(refresh.pk)
        # With a Celery worker running, the reopen's own enqueued execution may be the one
        # resuming the engines (this call then found the lease taken): wait for it to finish.
        wait_for(
            lambda: (
                not PolicyRefresh.objects.filter(
                    pk=refresh.pk, state=RefreshState.RELEASING
                ).exists()
            )
        )
    refresh.refresh_from_db()
    return refresh


def execute_in_thread(refresh) -> tuple[threading.Thread, list]:
    """Run the executor on `refresh` in a thread of its own (closing its database connection
    at the end); the list receives the executor's result."""
    done: list = []

    def run() -> None:
        try:
            done.append(execute_refresh(refresh.pk))
        finally:
            connection.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, done
