"""The membership diff rules, without a database or a network."""

from controlplane.fleet.discovery.diff import Snapshot, diff_membership
from controlplane.fleet.models import WorkerEventKind

BASE = Snapshot(
    routes=("pause_generation",),
    system_url="http://10.0.0.1:9000",
    model="m",
    world_size=1,
    weight_version="v1",
    version_known=True,
    liveness="alive",
)


def _with(**changes) -> Snapshot:
    values = {f: getattr(BASE, f) for f in Snapshot.__slots__}
    return Snapshot(**{**values, **changes})


def test_new_worker_joins_and_missing_worker_leaves():
    diff = diff_membership({"a": BASE}, {"b": BASE})
    assert diff.joined == ["b"] and diff.left == ["a"]
    assert diff.membership_changed


def test_gone_worker_that_reappears_joins_again_and_gone_is_not_left_twice():
    diff = diff_membership({"a": _with(gone=True), "b": _with(gone=True)}, {"a": BASE})
    assert diff.joined == ["a"] and diff.left == []


def test_changed_membership_fields_are_listed_with_old_and_new_values():
    new = _with(routes=("pause_generation", "resume_generation"), world_size=2)
    diff = diff_membership({"a": BASE}, {"a": new})
    assert diff.changed == {
        "a": {
            "routes": [["pause_generation"], ["pause_generation", "resume_generation"]],
            "world_size": [1, 2],
        }
    }


def test_erroring_transitions():
    diff = diff_membership(
        {"a": BASE, "b": _with(error="dead")}, {"a": _with(error="engine is dead"), "b": BASE}
    )
    assert diff.started_erroring == {"a": "engine is dead"}
    assert diff.stopped_erroring == ["b"]


def test_joining_while_erroring_is_both_joined_and_started_erroring():
    diff = diff_membership({}, {"a": _with(error="timed out")})
    assert diff.joined == ["a"] and diff.started_erroring == {"a": "timed out"}


def test_version_change_is_recorded_but_not_a_membership_change():
    diff = diff_membership({"a": BASE}, {"a": _with(weight_version="v2")})
    assert diff.version_changed == {"a": ["v1", "v2"]}
    assert not diff.membership_changed
    assert [c.kind for c in diff.changes()] == [WorkerEventKind.VERSION_CHANGED]


def test_unknown_version_is_not_a_version_change():
    diff = diff_membership({"a": BASE}, {"a": _with(weight_version=None, version_known=False)})
    assert diff.version_changed == {}


def test_liveness_change_only_between_known_states():
    assert diff_membership({"a": BASE}, {"a": _with(liveness="dead")}).liveness_changed == {
        "a": ["alive", "dead"]
    }
    assert diff_membership({"a": BASE}, {"a": _with(liveness="unknown")}).liveness_changed == {}


def test_identical_fleet_has_no_changes():
    diff = diff_membership({"a": BASE}, {"a": BASE})
    assert diff.changes() == [] and not diff.touched


def test_audit_details_cap_the_key_lists():
    diff = diff_membership({}, {f"k{i:03}": BASE for i in range(120)})
    details = diff.audit_details()
    assert details["joined"]["count"] == 120 and len(details["joined"]["keys"]) == 50
