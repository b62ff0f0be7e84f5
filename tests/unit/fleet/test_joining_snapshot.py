"""Storage hands the diff a shared snapshot for joining workers: the diff must not tell."""

from dataclasses import asdict

from controlplane.fleet.discovery.diff import Snapshot, diff_membership
from controlplane.fleet.discovery.observe import Observation
from controlplane.fleet.discovery.store import _obs_snapshot, _snapshot_against

OLD = Snapshot(routes=("liveness_probe",), system_url="http://a", model="m", liveness="alive")


def _observation(instance: int, **fields) -> Observation:
    return Observation(
        namespace="ns",
        component="backend",
        endpoint="rl",
        instance_id=str(instance),
        routes=("liveness_probe", "get_weight_version"),
        system_url=f"http://10.0.0.{instance}:9000",
        model="m",
        world_size=2,
        version_probed=True,
        version_ok=True,
        weight_version="v2",
        liveness="dead",
        **fields,
    )


def test_the_diff_is_the_same_with_full_or_joining_snapshots():
    observed = [
        _observation(1),  # new
        _observation(2, error="bad routes"),  # new and erroring
        _observation(3),  # came back after leaving
        _observation(4, error="still bad"),  # came back erroring
        _observation(5),  # present: changed liveness, version and system_url
    ]
    previous = {
        observed[2].key: Snapshot(gone=True, error="old", weight_version="v1", version_known=True),
        observed[3].key: Snapshot(gone=True),
        observed[4].key: OLD,
        "ns/backend/rl/9": OLD,  # leaves
    }
    full = diff_membership(previous, {o.key: _obs_snapshot(o) for o in observed})
    shared = diff_membership(
        previous, {o.key: _snapshot_against(previous.get(o.key), o) for o in observed}
    )
    assert asdict(shared) == asdict(full)
    assert shared.changes() == full.changes()
    assert len(full.joined) == 4 and len(full.started_erroring) == 2 and full.changed


def test_a_present_worker_gets_its_full_snapshot():
    o = _observation(5)
    assert _snapshot_against(OLD, o) == _obs_snapshot(o)
    assert _snapshot_against(Snapshot(gone=True), o) != _obs_snapshot(o)
