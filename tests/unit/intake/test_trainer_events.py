"""The trainer's external-update events, replayed from the stored fixtures: a checkpoint that
asks for `external` plans that method, and `refresh.applied` validates as the API's body."""

from __future__ import annotations

import json
from pathlib import Path

import pydantic
import pytest

from controlplane.intake.webhooks.trainer.events import (
    EVENT_TYPES,
    REFRESH_APPLIED,
    Applied,
    CheckpointReady,
)

FIXTURES = Path(__file__).resolve().parents[3] / "controlplane/intake/webhooks/trainer/fixtures"


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def test_an_external_checkpoint_plans_the_external_method_with_its_timeout():
    event = CheckpointReady.model_validate(fixture("checkpoint_ready_external")["data"])
    assert event.target() == {
        "weight_version": 1400,
        "method": "external",
        "apply_timeout_s": 120.0,
    }


@pytest.mark.parametrize(
    "extra",
    [{"model_path": "/ckpt/1400"}, {"distributed": {"group": {}, "update": {}}}],
    ids=["with a path", "with a group"],
)
def test_a_checkpoint_gives_exactly_one_method(extra):
    data = {**fixture("checkpoint_ready_external")["data"], **extra}
    with pytest.raises(pydantic.ValidationError, match="exactly one of"):
        CheckpointReady.model_validate(data)


def test_the_applied_report_names_instances_as_decimal_ids():
    envelope = fixture("refresh_applied")
    assert envelope["type"] == REFRESH_APPLIED and REFRESH_APPLIED in EVENT_TYPES
    report = Applied.model_validate(envelope["data"])
    assert report.instance_ids == ["7587888643216711217"]
    with pytest.raises(pydantic.ValidationError):
        Applied.model_validate({**envelope["data"], "instance_ids": ["worker-1"]})
    with pytest.raises(pydantic.ValidationError):
        Applied.model_validate({"refresh_id": 1})  # the version is required
    assert Applied.model_validate({"refresh_id": 1, "weight_version": "v"}).instance_ids is None
