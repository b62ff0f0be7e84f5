"""The fleet most strategy tests run on: twelve vLLM workers, four in each of rl-a, rl-b and
rl-c, whose scope starts verified at v1 (so a staged refresh has an old set to keep serving).
A test module with another fleet defines its own `fleet` and `source`."""

from __future__ import annotations

import pytest

from controlplane.refresh.models import RefreshState
from tests.integration.refresh.helpers import fleet_config, make_source, run_inline


@pytest.fixture
def fleet(simfleet_factory):
    return simfleet_factory(fleet_config(12))


@pytest.fixture
def source(fleet, operator):
    source = make_source(fleet)
    first = run_inline(source, operator, "v1")
    assert first.state == RefreshState.SUCCEEDED, first.held_reason
    return source
