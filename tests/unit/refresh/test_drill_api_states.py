"""The drill API's schema is the command's JSON: the same keys, and outcome and phase literals
that are the model's choices (so the schema never refuses a value the database holds)."""

from typing import get_args

from controlplane.fleet.models import Source
from controlplane.intake.api.drills import DrillOut, Outcome
from controlplane.refresh.drills.public import drill_json
from controlplane.refresh.models import DrillOutcome, DrillPhase, DrillRun


def test_outcomes_and_phases_are_the_models():
    assert set(get_args(Outcome)) == set(DrillOutcome.values)
    assert set(get_args(DrillOut.model_fields["phase"].annotation)) == set(DrillPhase.values)


def test_the_schema_has_the_commands_keys():
    drill = DrillRun(source=Source(name="s"), current_policy={}, previous_policy={})
    assert set(DrillOut.model_fields) == set(drill_json(drill))
