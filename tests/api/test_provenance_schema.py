"""The provenance export's schemas are derived from the trail's dataclasses: the OpenAPI output
is the one the hand-written schemas gave (`openapi_provenance.json`, recorded from them), and a
field added to a dataclass reaches the schema without a second edit."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from controlplane.intake.api.derive import schema_of
from controlplane.intake.api.provenance import (
    AdmissionWindowOut,
    CheckpointOut,
    ProvenanceOut,
    RefreshTrailOut,
    WorkerOutcomeOut,
)
from controlplane.intake.api.site import api
from controlplane.intake.provenance.trail import (
    AdmissionWindow,
    Checkpoint,
    RefreshTrail,
    Trail,
    WorkerOutcome,
)

EXPECTED = json.loads((Path(__file__).parent / "openapi_provenance.json").read_text())


def _reachable(name: str, components: dict, out: dict) -> dict:
    if name not in out:
        out[name] = components[name]
        for ref in _refs(components[name]):
            _reachable(ref.rsplit("/", 1)[-1], components, out)
    return out


def _refs(node):
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


def _without_refresh_keys(schemas: dict, refresh_keys: set[str]) -> dict:
    """`RefreshTrailOut` without the keys it takes from `RefreshOut` (which grows with the
    refresh API; those keys are compared with `RefreshOut` itself below)."""
    trimmed = json.loads(json.dumps(schemas))
    trail = trimmed["RefreshTrailOut"]
    trail["properties"] = {k: v for k, v in trail["properties"].items() if k not in refresh_keys}
    trail["required"] = [k for k in trail.get("required", []) if k not in refresh_keys]
    return trimmed


def test_the_openapi_output_is_the_one_the_written_out_schemas_gave():
    components = api.get_openapi_schema()["components"]["schemas"]
    now = _reachable("ProvenanceOut", components, {})
    refresh_keys = set(components["RefreshOut"]["properties"])
    recorded_refresh_keys = refresh_keys & set(EXPECTED["RefreshTrailOut"]["properties"])
    # The trail's own keys are exactly the recorded ones...
    assert _without_refresh_keys(now, refresh_keys) == _without_refresh_keys(
        EXPECTED, recorded_refresh_keys
    )
    # ...and every key of a refresh reaches the trail with the refresh API's own schema.
    trail_properties = now["RefreshTrailOut"]["properties"]
    for key, spec in components["RefreshOut"]["properties"].items():
        assert trail_properties[key] == spec, key


def test_every_dataclass_field_is_in_its_schema():
    pairs = [
        (Checkpoint, CheckpointOut, set()),
        (WorkerOutcome, WorkerOutcomeOut, set()),
        (RefreshTrail, RefreshTrailOut, {"refresh"}),  # flattened into the refresh's own keys
        (AdmissionWindow, AdmissionWindowOut, set()),
        (Trail, ProvenanceOut, set()),
    ]
    for dc, schema, flattened in pairs:
        names = {f.name for f in dataclasses.fields(dc)} - flattened
        assert names <= set(schema.model_fields), (dc.__name__, names - set(schema.model_fields))


def test_a_new_dataclass_field_reaches_the_schema_with_its_type():
    @dataclasses.dataclass
    class Grown(Checkpoint):
        signed_by: str | None = None

    schema = schema_of(Grown, "GrownOut")
    assert schema.model_fields["signed_by"].annotation == str | None
    assert schema.model_fields["signed_by"].is_required()  # always written by the serializer
