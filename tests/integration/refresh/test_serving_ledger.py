"""The serving ledger is the one truth about what each worker serves; gates are its view.

- a namespace nobody ever refreshed is `unverified` (never `open`) over the API, the gate
  stream and the Gates page;
- a force-reopen of a held refresh admits what rl-b's workers really serve (the new version,
  already loaded), names it, and drift never quietly turns the approver's decision back;
- a waves refresh that admits as it verifies is `open_mixed`, per instance and version.
"""

from __future__ import annotations

import itertools
import json

import pytest
from django.test import Client

from controlplane.fleet.models import DriftPolicy, Source
from controlplane.refresh import drift, intents
from controlplane.refresh.executor import execute_refresh
from controlplane.refresh.models import (
    Admission,
    Evidence,
    Gate,
    GateState,
    JournalEntry,
    PolicyRefresh,
    Quarantine,
    QuarantineState,
    RefreshState,
    ServingInterval,
)
from controlplane.simfleet import Fault
from tests.integration.refresh.helpers import (
    actor_for,
    fleet_config,
    fleet_versions,
    make_source,
    run_inline,
    sync_workers,
    wait_for,
)

pytestmark = pytest.mark.django_db(transaction=True)


def _api(client: Client, source: Source, namespace: str) -> dict:
    response = client.get(f"/api/v1/gates/{source.name}/{namespace}")
    assert response.status_code == 200, response.content
    return response.json()


def test_a_never_refreshed_namespace_is_unverified_on_api_stream_and_page(
    simfleet_factory, viewer, viewer_client, celery_worker
):
    source = make_source(simfleet_factory(fleet_config(6)))
    sync_workers(source)  # discovery: the drift task gives each namespace its gate
    wait_for(lambda: Gate.objects.filter(source=source).count() == 3)
    body = _api(viewer_client, source, "rl-a")
    assert body["state"] == "unverified" and body["open"] is False
    assert body["admitted"] == [] and body["verified_instances"] == []
    assert body["reason"].startswith("never verified")
    gate = Gate.objects.get(source=source, namespace="rl-a")
    assert gate.unverified_count == 2  # the ledger knows its two workers, admits neither
    assert not ServingInterval.objects.filter(source=source).exclude(admission="").exists()

    page = viewer_client.get("/refreshes/gates/").content.decode()
    assert f'id="gate-{gate.pk}" data-state="unverified"' in page

    from asgiref.sync import async_to_sync

    from tests.integration.intake.test_gate_stream import connected, session_headers

    headers = session_headers(viewer)

    async def snapshot() -> dict:
        c = await connected(headers)
        try:
            return json.loads(await c.receive_from(timeout=10))
        finally:
            await c.disconnect()

    frame = async_to_sync(snapshot)()
    assert frame["event"] == "gates.snapshot"
    streamed = {g["namespace"]: g for g in frame["gates"]}
    assert streamed["rl-a"]["state"] == "unverified" and streamed["rl-a"]["open"] is False


@pytest.fixture
def held_with_rl_b_on_new_version(simfleet_factory, operator):
    """v1 verified everywhere; a refresh to v2 holds at verify on one rl-a worker's readback,
    after every worker (rl-b's included) loaded v2."""
    fleet = simfleet_factory(fleet_config(6))
    source = make_source(fleet, drift_policy=DriftPolicy.QUARANTINE)
    first = run_inline(source, operator, "v1")
    assert first.state == RefreshState.SUCCEEDED, first.held_reason
    rl_a = [w["key"] for w in fleet.workers() if w["namespace"] == "rl-a"]
    fleet.inject(rl_a[0], "get_weight_version", Fault.error("readback broken"))
    held = run_inline(source, operator, "v2")
    assert held.state == RefreshState.HELD and held.failed_step == "verify"
    rl_b = {w["identity"]: w for w in fleet.workers() if w["namespace"] == "rl-b"}
    assert {fleet_versions(fleet)[k] for k in rl_b} == {"v2"}
    return fleet, source, held


def test_force_reopen_admits_what_rl_b_serves_and_drift_never_reverses_it(
    held_with_rl_b_on_new_version, approver, viewer_client
):
    fleet, source, held = held_with_rl_b_on_new_version
    gate = Gate.objects.get(source=source, namespace="rl-b")
    intents.force_reopen_gate(gate, actor=actor_for(approver), reason="rl-b checked by hand")
    execute_refresh(held.pk)  # resumes rl-b's engines, holds again for rl-a and rl-c

    body = _api(viewer_client, source, "rl-b")
    assert body["state"] == "open_forced" and body["open"] is True
    # The gate names the version rl-b really serves, per instance and in the forced block.
    assert body["version"] == "v2"
    assert body["versions"] == [{"version": "v2", "count": 2, "verified": 0}]
    assert {e["version"] for e in body["admitted"]} == {"v2"}
    assert {e["evidence"] for e in body["admitted"]} == {Evidence.REPORTED}
    assert {e["admission"] for e in body["admitted"]} == {Admission.FORCED}
    assert {i["version"] for i in body["forced"]["instances"]} == {"v2"}
    assert body["forced"]["by"] == approver.username
    # It was last verified at v1: the disagreement is shown, for a person to resolve.
    assert body["verified_version"] == "v1"
    assert {d["version"] for d in body["disagreements"]} == {"v2"}

    # Discovery and drift reconciliation run: nothing is quarantined, nothing caught "up" to
    # v1, and the gate still says what it said.
    sync_workers(source)
    assert drift.reconcile_source(source.pk) == []
    assert not Quarantine.objects.filter(source=source, namespace="rl-b").exists()
    rl_b = [w["identity"] for w in fleet.workers() if w["namespace"] == "rl-b"]
    assert {fleet_versions(fleet)[k] for k in rl_b} == {"v2"}
    again = _api(viewer_client, source, "rl-b")
    assert again["state"] == "open_forced" and again["version"] == "v2"

    # The ledger behind it: each rl-b worker's history is v1 verified by the first refresh,
    # then no longer admitted when the second closed the gate, then v2 forced.
    for instance_id in [e["instance_id"] for e in body["admitted"]]:
        history = list(
            ServingInterval.objects.filter(source=source, instance_id=instance_id).order_by(
                "valid_from", "id"
            )
        )
        assert [(h.version, h.evidence, h.admission) for h in history] == [
            ("v1", Evidence.VERIFIED_REFRESH, Admission.VERIFIED),
            ("v1", Evidence.VERIFIED_REFRESH, Admission.NOT_ADMITTED),
            ("v2", Evidence.REPORTED, Admission.FORCED),
        ]
        assert history[-1].valid_to is None and history[-1].forced_reason == "rl-b checked by hand"
        assert all(h.valid_to == n.valid_from for h, n in itertools.pairwise(history))

        # Provenance from the ledger: before the second refresh, v1 verified; while it held
        # the gate closed, v1 or v2 (in transition); now, v2 forced.
        def asked(instance_id: str = instance_id, **params) -> dict:
            response = viewer_client.get(
                "/api/v1/provenance", {"instance_id": instance_id, **params}
            )
            assert response.status_code == 200, response.content
            return response.json()

        verified_then = asked(at=history[0].valid_from.isoformat())
        assert verified_then["versions"] == ["v1"]
        assert verified_then["intervals"][0]["confidence"] == "verified"
        assert verified_then["intervals"][0]["refresh_id"] == history[0].refresh_id
        # The journal rows behind it: that refresh's successful calls to this very worker,
        # its version readback among them.
        proof = JournalEntry.objects.filter(pk__in=verified_then["intervals"][0]["journal_ids"])
        assert {(j.refresh_id, j.planned_worker.instance_id, j.ok) for j in proof} == {
            (history[0].refresh_id, instance_id, True)
        }
        assert ("verify", "get_weight_version") in {(j.step, j.operation) for j in proof}
        moving = asked(at=history[1].valid_from.isoformat())
        assert moving["versions"] == ["v1", "v2"]
        assert moving["intervals"][0]["confidence"] == "in_transition"
        now = asked(at=history[2].valid_from.isoformat())
        assert now["versions"] == ["v2"] and now["intervals"][0]["confidence"] == "forced"
        assert now["intervals"][0]["forced"]["reason"] == "rl-b checked by hand"
        whole = asked(**{"from": history[0].valid_from.isoformat()})
        assert whole["versions"] == ["v1", "v2"] and len(whole["intervals"]) == 3


def test_provenance_needs_a_reader_and_clear_input(viewer_client, client):
    assert client.get(
        "/api/v1/provenance", {"instance_id": "7", "at": "2026-01-01T00:00:00Z"}
    ).status_code in (401, 403)
    for params in (
        {"instance_id": "7"},  # neither at nor from
        {"instance_id": "7", "at": "2026-01-01T00:00:00Z", "from": "2026-01-01T00:00:00Z"},
        {"instance_id": "-1", "at": "2026-01-01T00:00:00Z"},
        {"instance_id": "7", "at": "yesterday"},
        {"instance_id": "7", "from": "2026-01-02T00:00:00Z", "to": "2026-01-01T00:00:00Z"},
    ):
        response = viewer_client.get("/api/v1/provenance", params)
        assert response.status_code in (400, 422), (params, response.content)
        assert response.json()["error"]["code"]
    empty = viewer_client.get(
        "/api/v1/provenance", {"instance_id": "7", "at": "2026-01-01T00:00:00Z"}
    )
    assert empty.status_code == 200 and empty.json()["intervals"] == []


def test_a_waves_refresh_admitting_as_it_verifies_is_open_mixed(
    simfleet_factory, operator, viewer_client
):
    fleet = simfleet_factory(fleet_config(12))
    source = make_source(fleet)
    assert run_inline(source, operator, "v1").state == RefreshState.SUCCEEDED
    strategy = {
        "kind": "waves",
        "max_unavailable": 2,
        "admit_as_verified": True,
        "pause_after": [1],
    }
    refresh = run_inline(source, operator, "v2", strategy=strategy)
    assert refresh.state == RefreshState.WAITING, refresh.held_reason

    for namespace in ("rl-a", "rl-b", "rl-c"):
        body = _api(viewer_client, source, namespace)
        assert body["state"] == GateState.OPEN_MIXED and body["open"] is True
        assert body["version"] is None
        assert sorted((v["version"], v["count"], v["verified"]) for v in body["versions"]) == [
            ("v1", 2, 2),
            ("v2", 2, 2),
        ]
        served = fleet_versions(fleet)
        keys = {w["identity"]: w for w in fleet.workers()}
        for entry in body["admitted"]:
            assert served[entry["key"]] == entry["version"], entry
            assert keys[entry["key"]]["namespace"] == namespace
        sets = body["instance_sets"]
        assert len(sets["serving_old"]) == 2 and len(sets["verified_new"]) == 2


def test_an_old_refresh_page_shows_its_own_end_state_and_a_labelled_now(
    simfleet_factory, operator, viewer_client
):
    source = make_source(simfleet_factory(fleet_config(6)))
    first = run_inline(source, operator, "v1")
    second = run_inline(source, operator, "v2")
    assert first.state == second.state == RefreshState.SUCCEEDED

    page = viewer_client.get(f"/refreshes/{first.pk}/").content.decode()
    assert "As this refresh left it" in page and "Gate now" in page
    # Then: the ledger at #1's end, v1 verified; now: #2's v2, labelled as such.
    assert page.count('<td class="gate-then">admitting 2: 2 at v1 (verified)</td>') == 3
    assert page.count('<small class="muted gate-now">now</small>') == 3
    assert "open at v2 for 2 verified workers" in page
    assert "open at v1" not in page


def _served_by_calls(worker: dict, initial, at: float):
    """What the simulated worker's own call log says it served at `at` (epoch seconds): the
    version of its last successful weight update (or version declaration) before then, or what
    it started with. vLLM answers a refused call with HTTP 200 and `status: error`."""
    version = initial
    for call in worker["calls"]:
        if call["at"] > at:
            break
        body = call.get("body") or {}
        refused = isinstance(call.get("reply"), dict) and call["reply"].get("status") == "error"
        changes = call["route"].startswith("update_weights") or call["route"] == (
            "set_weight_version"
        )
        if changes and call["status"] == 200 and not refused:
            version = body.get("weight_version", version)
    return version


def test_provenance_of_random_instants_agrees_with_the_workers_own_call_logs(
    simfleet_factory, operator, approver
):
    """Refresh, a held refresh force-reopened namespace by namespace (one worker unable to
    read its version back), another refresh: for 1,000 random (instance, time) pairs the
    ledger's answer contains what the worker's own call log says it served, and a verified or
    forced answer names exactly that version."""
    import random
    from datetime import UTC, datetime

    from controlplane.refresh.windows import FORCED, VERIFIED, served_at
    from tests.integration.refresh.helpers import force_reopen_each

    fleet = simfleet_factory(fleet_config(6))
    source = make_source(fleet)
    initial = {str(w["instance_id"]): w["version"] for w in fleet.workers()}
    assert run_inline(source, operator, "v1").state == RefreshState.SUCCEEDED
    start = datetime.now(UTC).timestamp()
    rl_a = [w["key"] for w in fleet.workers() if w["namespace"] == "rl-a"]
    fleet.inject(rl_a[0], "get_weight_version", Fault.error("readback broken"))
    held = run_inline(source, operator, "v2")
    assert held.state == RefreshState.HELD
    force_reopen_each(held, approver)
    fleet.clear_faults(rl_a[0])
    assert run_inline(source, operator, "v3").state == RefreshState.SUCCEEDED
    end = datetime.now(UTC).timestamp()

    workers = {str(w["instance_id"]): fleet.state(w["key"]) for w in fleet.workers()}
    rng = random.Random(23)
    answered = exact = 0
    for _ in range(1000):
        instance_id = rng.choice(sorted(workers))
        at = rng.uniform(start, end)
        truth = _served_by_calls(workers[instance_id], initial[instance_id], at)
        found = served_at(instance_id, datetime.fromtimestamp(at, UTC))
        assert len(found) <= 1, found  # a point in time is one interval
        if not found or not found[0].versions:
            continue
        answered += 1
        assert truth in found[0].versions, (instance_id, at, truth, found[0])
        if found[0].confidence in (VERIFIED, FORCED):
            exact += 1
            assert found[0].versions == [truth], (instance_id, at, truth, found[0])
    assert answered > 900 and exact > 300


def test_provenance_agrees_with_the_call_logs_through_drift_catch_up_and_rollback(
    simfleet_factory, operator, approver, celery_worker
):
    """Refresh; a worker restarted at its base weights, quarantined on discovery and caught up
    alone (Celery, as in production); a held refresh force-reopened namespace by namespace;
    a refresh; a held refresh rolled back: for 1,000 random (instance, time) pairs the ledger's
    answer contains what the worker's own call log says it served, and a verified or forced
    answer names exactly that version. An instance is asked about only while its process
    lived (the restarted one's old instance served nothing after it)."""
    import random
    import time
    from datetime import UTC, datetime

    from controlplane.refresh.windows import FORCED, IN_TRANSITION, VERIFIED, served_at
    from tests.integration.drift.test_drift_quarantine import detected_within_two_discoveries
    from tests.integration.refresh.helpers import force_reopen_each

    fleet = simfleet_factory(fleet_config(6))
    source = make_source(fleet, drift_policy=DriftPolicy.QUARANTINE)
    initial = {str(w["instance_id"]): w["version"] for w in fleet.workers()}
    assert run_inline(source, operator, "v1").state == RefreshState.SUCCEEDED
    start = time.time()

    # Drift: the simulated fleet restarts an rl-a worker (new instance id, base weights);
    # discovery sees it, drift quarantines it, the catch-up brings it to v1 and admits it.
    restarted = next(w for w in fleet.workers() if w["namespace"] == "rl-a")
    old_id = str(restarted["instance_id"])
    gone = {old_id: fleet.state(old_id)}  # its call log, kept before the process goes
    died = time.time()
    new_id = str(fleet.restart(restarted["key"]))
    born = time.time()
    initial[new_id] = fleet.state(new_id)["version"]
    caught_up = detected_within_two_discoveries(
        source,
        lambda: Quarantine.objects.filter(
            source=source, instance_id=new_id, state=QuarantineState.ADMITTED
        ).first(),
        timeout=30,
    )
    assert caught_up.kind == "joined" and fleet.state(new_id)["version"] == "v1"

    # Force-reopen: a held refresh (one worker cannot read its version back), namespace by
    # namespace; then a refresh that verifies everyone again.
    rl_a = [w["key"] for w in fleet.workers() if w["namespace"] == "rl-a"]
    fleet.inject(rl_a[0], "get_weight_version", Fault.error("readback broken"))
    held = run_inline(source, operator, "v2")
    assert held.state == RefreshState.HELD
    force_reopen_each(held, approver)
    fleet.clear_faults(rl_a[0])
    assert run_inline(source, operator, "v3").state == RefreshState.SUCCEEDED
    # The worker force-reopened without a readback reads back v2 once fixed: that is what it
    # serves, recorded as such, not drift to be "caught up" back to v1.
    assert list(Quarantine.objects.filter(source=source).values_list("instance_id")) == [(new_id,)]

    # Rollback: a refresh to v4 holds (an rl-b generation is cancelled) after every worker
    # loaded v4; the rollback (run by Celery) takes everyone back to v3.
    rl_b = [w["key"] for w in fleet.workers() if w["namespace"] == "rl-b"]
    fleet.inject(rl_b[0], "generate", Fault.cancel())
    doomed = run_inline(source, operator, "v4")
    assert doomed.state == RefreshState.HELD
    fleet.clear_faults()
    rollback = intents.rollback_policy_refresh(doomed, actor=actor_for(operator))
    wait_for(
        lambda: PolicyRefresh.objects.filter(pk=rollback.pk, state=RefreshState.SUCCEEDED).exists(),
        timeout=60,
    )
    assert set(fleet_versions(fleet).values()) == {"v3"}
    end = time.time()
    logs = {str(w["instance_id"]): fleet.state(w["key"]) for w in fleet.workers()} | gone
    lived = {old_id: (start, died), new_id: (born, end)}
    rng = random.Random(23)
    asked = answered = exact = 0
    truths: set = set()
    confidences: set[str] = set()
    for _ in range(1000):
        instance_id = rng.choice(sorted(logs))
        at = rng.uniform(start, end)
        alive_from, alive_to = lived.get(instance_id, (start, end))
        if not alive_from <= at <= alive_to:
            continue  # no process: nothing was served to attribute
        asked += 1
        truth = _served_by_calls(logs[instance_id], initial[instance_id], at)
        found = served_at(instance_id, datetime.fromtimestamp(at, UTC))
        assert len(found) <= 1, found  # a point in time is one interval
        if not found or not found[0].versions:
            continue
        answered += 1
        truths.add(truth)
        confidences.add(found[0].confidence)
        assert truth in found[0].versions, (instance_id, at, truth, found[0])
        if found[0].confidence in (VERIFIED, FORCED):
            exact += 1
            assert found[0].versions == [truth], (instance_id, at, truth, found[0])
    assert asked > 800 and answered > 0.85 * asked and exact > 300, (asked, answered, exact)
    assert {"v1", "v2", "v3", "v4"} <= truths, truths
    assert {VERIFIED, FORCED, IN_TRANSITION} <= confidences, confidences
