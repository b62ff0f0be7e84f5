"""Which states an approver can end a refresh from, and what ending leaves behind."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.audit.recorder import Actor
from controlplane.fleet.models import Source
from controlplane.refresh import intents
from controlplane.refresh.errors import InvalidTransition
from controlplane.refresh.models import (
    ACTIVE_STATES,
    EXECUTING_STATES,
    Gate,
    GateState,
    PolicyRefresh,
    RefreshState,
    ScopeLock,
)

pytestmark = pytest.mark.django_db
ACTOR = Actor.system("end test")
DISK = {"weight_version": "v2", "method": "disk", "model_path": "/ckpt/v2"}


@pytest.fixture
def source(db):
    return Source.objects.create(
        name="fleet-a", listener_url="http://10.0.0.1:8001", allowed_networks=["10.0.0.0/8"]
    )


def active_refresh(source, state, **fields):
    refresh = PolicyRefresh.objects.create(
        source=source, namespaces=["rl-a"], target=DISK, state=state, **fields
    )
    if state in ACTIVE_STATES:
        ScopeLock.objects.create(source=source, namespace="rl-a", refresh=refresh)
        Gate.objects.create(
            source=source, namespace="rl-a", state=GateState.CLOSED, active_refresh=refresh
        )
    return refresh


@pytest.mark.parametrize("state", list(RefreshState))
def test_every_active_refresh_without_a_live_executor_can_be_ended(source, state):
    refresh = active_refresh(source, state)
    if state not in ACTIVE_STATES:
        with pytest.raises(InvalidTransition):
            intents.end_policy_refresh(refresh, actor=ACTOR, reason="tidy up")
        refresh.refresh_from_db()
        assert refresh.state == state
        return
    assert intents.can_end(refresh)
    intents.end_policy_refresh(refresh, actor=ACTOR, reason="tidy up")
    refresh.refresh_from_db()
    assert refresh.state == RefreshState.ABORTED and refresh.finished_at is not None
    assert not ScopeLock.objects.exists()
    gate = Gate.objects.get()
    assert gate.active_refresh is None and not gate.is_open
    assert "ended by" in gate.reason and "tidy up" in gate.reason


@pytest.mark.parametrize("state", sorted(EXECUTING_STATES))
def test_a_refresh_whose_executor_is_alive_must_be_aborted_first(source, state):
    refresh = active_refresh(
        source, state, lease_token=3, lease_expires_at=timezone.now() + timedelta(seconds=30)
    )
    assert not intents.can_end(refresh)
    # An aborting one is already stopping: it ends aborted on its own within seconds.
    wait = "ends it aborted within seconds" if state == RefreshState.ABORTING else "abort it first"
    with pytest.raises(InvalidTransition, match=wait):
        intents.end_policy_refresh(refresh, actor=ACTOR, reason="stuck")
    assert ScopeLock.objects.filter(refresh=refresh).exists()
