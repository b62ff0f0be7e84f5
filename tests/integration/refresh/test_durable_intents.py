"""Intents that call the network between their transactions refuse an outer transaction.

`atomic(durable=True)` makes wrapping one a loud error instead of a transaction that holds its
row locks across a discovery or a worker call (and hides its writes until the caller commits).
"""

from __future__ import annotations

import pytest
from django.db import transaction

from controlplane.refresh import intents
from controlplane.refresh.executor import execute_refresh
from controlplane.refresh.models import PolicyRefresh, RefreshState
from tests.integration.refresh.helpers import actor_for, fleet_config, make_source, plan

pytestmark = pytest.mark.django_db

TARGET = {"weight_version": "v2", "method": "disk", "model_path": "/ckpt/v2"}


@pytest.fixture
def source(simfleet_factory):
    return make_source(simfleet_factory(fleet_config(2)))


def test_planning_inside_an_outer_transaction_raises_and_stores_no_plan(source, operator):
    with pytest.raises(RuntimeError, match="durable"), transaction.atomic():
        intents.plan_policy_refresh(source=source, actor=actor_for(operator), target=TARGET)
    assert not PolicyRefresh.objects.exists()


def test_planning_on_its_own_stores_the_plan(source, operator):
    refresh = intents.plan_policy_refresh(source=source, actor=actor_for(operator), target=TARGET)
    assert PolicyRefresh.objects.get(pk=refresh.pk).state == RefreshState.PLANNED


def test_the_executor_inside_an_outer_transaction_raises_before_calling_a_worker(source, operator):
    refresh = plan(source, operator)
    intents.start_policy_refresh(refresh, actor=actor_for(operator), enqueue=False)
    refresh.refresh_from_db()
    started = refresh.state
    with pytest.raises(RuntimeError, match="durable"), transaction.atomic():
        execute_refresh(refresh.pk)
    refresh.refresh_from_db()
    assert refresh.state == started
    assert not refresh.results.exists()
