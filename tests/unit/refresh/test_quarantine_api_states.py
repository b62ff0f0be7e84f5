"""The API's quarantine state literal is spelled out for the type checker; keep it in step."""

from typing import get_args

from controlplane.intake.api.quarantines import States
from controlplane.refresh.models import QuarantineState


def test_api_states_are_the_model_states():
    assert set(get_args(States)) == set(QuarantineState.values)
