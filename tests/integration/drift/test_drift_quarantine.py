"""Drift between refreshes on the simulated fleet, with real Redis and Celery.

After a successful refresh to v2, a worker restarts (new instance id, base weights). Each
discovery is compared with the gates by a Celery task; what happens next is the source's drift
policy: quarantine (pause at once, catch up alone, admit back, gate open for the others),
close (the gate closes naming the worker) or observe (recorded, nothing paused).
"""

from __future__ import annotations

import re
import threading

import httpx
import pytest
from django.urls import reverse

from controlplane.fleet import discovery
from controlplane.fleet.models import DiscoveryTrigger, Worker
from controlplane.refresh import quarantine as quarantines
from controlplane.refresh.models import (
    Gate,
    GateState,
    Quarantine,
    QuarantineCall,
    QuarantineState,
    RefreshState,
    ServingInterval,
)
from controlplane.simfleet import Fault
from controlplane.simfleet.tokens import expected_completion_ids
from tests.integration.refresh.helpers import (
    actor_for,
    fleet_config,
    make_source,
    run_inline,
    wait_for,
)

UPDATE_ROUTE = "update_weights_from_disk"
PROMPT = [5, 6, 7, 8]


@pytest.fixture(autouse=True)
def short_calls(settings):
    settings.REFRESH_CALL_TIMEOUT_SECONDS = 5.0


@pytest.fixture
def fleet(simfleet_factory):
    return simfleet_factory(fleet_config(6))


def refreshed(fleet, operator, **source_fields):
    source = make_source(fleet, **source_fields)
    refresh = run_inline(source, operator, "v2")
    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason
    return source


def restart_one(fleet, namespace="rl-a") -> tuple[str, str]:
    """Restart a worker of `namespace`; returns (old, new) instance ids as decimal strings."""
    worker = next(w for w in fleet.workers() if w["namespace"] == namespace)
    new_id = fleet.restart(worker["key"])
    return str(worker["instance_id"]), str(new_id)


def discover(source) -> None:
    discovery.run_discovery(source.pk, trigger=DiscoveryTrigger.MANUAL, wait=15)


def detected_within_two_discoveries(source, predicate, timeout=20.0):
    """Run discovery the way the beat does, at most twice, until `predicate` holds."""
    for _ in range(2):
        discover(source)
        try:
            return wait_for(predicate, timeout=timeout)
        except AssertionError:
            continue
    raise AssertionError("drift not acted on within two discovery runs")


def gate(source, namespace="rl-a") -> Gate:
    return Gate.objects.get(source=source, namespace=namespace)


def pinned_completion(fleet, instance_id: str) -> list[int]:
    reply = httpx.post(
        f"{fleet.frontend_url}/v1/completions",
        json={
            "model": "sim-model",
            "prompt": PROMPT,
            "max_tokens": 4,
            "nvext": {
                "backend_instance_id": int(instance_id),
                "extra_fields": ["completion_token_ids"],
            },
        },
        timeout=30,
    )
    reply.raise_for_status()
    return reply.json()["nvext"]["completion_token_ids"]


def shown_while_quarantined(client, source, instance_id) -> None:
    """The fleet overview, source page, worker page and /metrics all show the quarantine."""
    worker = Worker.objects.get(source=source, instance_id=instance_id)
    for url in ("/", reverse("fleet:source", args=[source.pk])):
        page = client.get(url).content.decode()
        assert "1 drifted" in page and "1 quarantined" in page, url
    page = client.get(reverse("fleet:worker", args=[worker.pk])).content.decode()
    assert "joined" in page and "Quarantine" in page
    metrics = client.get(reverse("fleet:metrics")).content.decode()
    assert 'controlplane_drifted_workers{kind="joined",source="sim"} 1.0' in metrics
    assert re.search(
        r'controlplane_quarantined_workers\{source="sim",state="(quarantined|catching_up)"\} 1.0',
        metrics,
    )


def test_restarted_worker_is_paused_caught_up_alone_and_admitted(
    fleet, operator, operator_client, celery_worker
):
    source = refreshed(fleet, operator)
    before = gate(source)
    assert before.state == GateState.OPEN and len(before.verified_instances) == 2
    old_id, new_id = restart_one(fleet)
    # Slow its update down so the paused, quarantined state can be observed from outside.
    fleet.inject(new_id, UPDATE_ROUTE, Fault.latency(4.0, once=True))

    q = detected_within_two_discoveries(
        source,
        lambda: Quarantine.objects.filter(source=source, instance_id=new_id, paused=True).first(),
    )
    assert q.kind == "joined" and q.target["weight_version"] == "v2"
    assert fleet.state(new_id)["paused"] is True
    during = gate(source)
    assert during.state == GateState.OPEN  # open for the others the whole time
    assert new_id not in during.verified_instances and old_id not in during.verified_instances
    assert [d["instance_id"] for d in during.drift] == [new_id]
    shown_while_quarantined(operator_client, source, new_id)

    # A request pinned to it while it is quarantined waits; it is answered by v2 weights,
    # never by the base weights the restart brought back.
    answer: list[list[int]] = []
    asking = threading.Thread(target=lambda: answer.append(pinned_completion(fleet, new_id)))
    asking.start()

    q = wait_for(
        lambda: Quarantine.objects.filter(pk=q.pk, state=QuarantineState.ADMITTED).first(),
        timeout=30,
    )
    asking.join(30)
    assert answer == [expected_completion_ids("v2", PROMPT, 4)]
    after = gate(source)
    assert after.state == GateState.OPEN and after.drift == []
    assert new_id in after.verified_instances and old_id not in after.verified_instances
    assert fleet.state(new_id)["version"] == "v2" and fleet.state(new_id)["paused"] is False
    steps = list(QuarantineCall.objects.filter(quarantine=q).values_list("step", "operation"))
    assert steps[0] == ("pause", "pause")
    assert ("update", "update_from_disk") in steps and ("verify", "agreement") in steps
    # The ledger's interval for it points at the catch-up's own successful calls.
    now = ServingInterval.objects.get(source=source, instance_id=new_id, valid_to__isnull=True)
    proof = QuarantineCall.objects.filter(pk__in=now.journal_ids)
    assert now.quarantine_id == q.pk and proof.count() == len(now.journal_ids) > 0
    assert {c.quarantine_id for c in proof} == {q.pk} and all(c.ok for c in proof)
    assert gate(source, "rl-b").state == GateState.OPEN  # other namespaces untouched


def test_close_policy_closes_the_gate_naming_the_worker(fleet, operator, celery_worker):
    source = refreshed(fleet, operator, drift_policy="close")
    _, new_id = restart_one(fleet)
    closed = detected_within_two_discoveries(
        source, lambda: Gate.objects.filter(source=source, state=GateState.CLOSED).first()
    )
    assert closed.namespace == "rl-a" and new_id in closed.reason
    assert [d["state"] for d in closed.drift] == ["closed"]
    assert fleet.state(new_id)["paused"] is False
    assert not Quarantine.objects.exists()
    assert gate(source, "rl-b").state == GateState.OPEN


def test_observe_policy_records_and_never_pauses(fleet, operator, celery_worker):
    source = refreshed(fleet, operator, drift_policy="observe")
    _, new_id = restart_one(fleet)
    observed = detected_within_two_discoveries(
        source, lambda: Gate.objects.filter(source=source, drift__0__instance_id=new_id).first()
    )
    assert observed.state == GateState.OPEN and observed.drift[0]["state"] == "observed"
    assert new_id not in observed.verified_instances and observed.unverified_count == 1
    assert fleet.state(new_id)["paused"] is False
    assert not Quarantine.objects.exists()


def test_worker_that_cannot_be_caught_up_stays_quarantined_and_has_exits(
    fleet, operator, celery_worker
):
    source = refreshed(fleet, operator)
    _, new_id = restart_one(fleet)
    fleet.inject(new_id, UPDATE_ROUTE, Fault.http(500, "disk read failed"))
    q = detected_within_two_discoveries(
        source,
        lambda: Quarantine.objects.filter(instance_id=new_id, state=QuarantineState.FAILED).first(),
    )
    assert "update" in q.reason and "disk read failed" in q.reason
    assert q.paused and fleet.state(new_id)["paused"] is True
    assert gate(source).state == GateState.OPEN
    assert gate(source).drift[0]["state"] == QuarantineState.FAILED

    # The next discovery leaves it to its quarantine: no second quarantine, still paused.
    discover(source)
    assert Quarantine.objects.filter(instance_id=new_id).count() == 1

    # Release is refused: its readback is not v2, it would serve the wrong policy.
    with pytest.raises(quarantines.QuarantineRefused, match="wrong policy"):
        quarantines.release(q, actor=actor_for(operator), reason="need capacity")
    assert fleet.state(new_id)["paused"] is True

    # Drop is refused while it is still there; retry after the fault is fixed admits it.
    with pytest.raises(quarantines.QuarantineRefused, match="still in the fleet"):
        quarantines.drop(q, actor=actor_for(operator))
    fleet.clear_faults(new_id)
    quarantines.retry(q, actor=actor_for(operator))
    wait_for(
        lambda: Quarantine.objects.filter(pk=q.pk, state=QuarantineState.ADMITTED).exists(),
        timeout=30,
    )
    assert new_id in gate(source).verified_instances


def test_disagreeing_worker_fails_the_cross_check_and_can_be_released(
    fleet, operator, celery_worker
):
    source = refreshed(fleet, operator)
    _, new_id = restart_one(fleet)
    fleet.inject(new_id, "generate", Fault.wrong_tokens())
    q = detected_within_two_discoveries(
        source,
        lambda: Quarantine.objects.filter(instance_id=new_id, state=QuarantineState.FAILED).first(),
    )
    assert q.reason.startswith("agreement: disagrees with verified")
    assert fleet.state(new_id)["paused"] is True  # paused again after the failed check

    quarantines.release(q, actor=actor_for(operator), reason="investigating, keep it serving")
    q.refresh_from_db()
    assert q.state == QuarantineState.RELEASED and not q.paused
    assert fleet.state(new_id)["paused"] is False
    released = gate(source)
    assert new_id not in released.verified_instances
    assert released.drift[0]["state"] == QuarantineState.RELEASED


def test_quarantined_worker_that_leaves_is_dropped(fleet, operator, celery_worker):
    source = refreshed(fleet, operator)
    _, new_id = restart_one(fleet)
    fleet.inject(new_id, UPDATE_ROUTE, Fault.http(500, "disk read failed"))
    q = detected_within_two_discoveries(
        source,
        lambda: Quarantine.objects.filter(instance_id=new_id, state=QuarantineState.FAILED).first(),
    )
    fleet.remove_worker(new_id)
    discover(source)
    q = wait_for(
        lambda: Quarantine.objects.filter(pk=q.pk, state=QuarantineState.DROPPED).first(),
        timeout=20,
    )
    assert q.reason == "left the fleet"
    assert gate(source).drift == [] and gate(source).state == GateState.OPEN
