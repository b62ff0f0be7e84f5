"""One complete training iteration, proven: `examples/toy_trainer.py` runs 3 iterations
against the simulated fleet with the real web server, Celery worker, Redis and PostgreSQL:
announce step k, wait for the gate, generate pinned to admitted instances, admit with the
guard, check every admitted sample is stamped k.

Injected on the way: in iteration 2 a worker restarts at base weights (a new instance id),
and the loop also samples from it as a framework whose pool is every discovered worker would;
every first generation on each worker times out once and is retried as the same attempt."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from dynamo_rl_trainer import AdmissionGuard, ControlPlane

from controlplane.fleet import discovery
from controlplane.fleet.models import DiscoveryTrigger, Source
from controlplane.simfleet.faults import Fault
from tests.integration.trainer.harness import build_stack

pytestmark = pytest.mark.celery

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "toy_trainer.py"
BATCH = 6


def load_example():
    spec = importlib.util.spec_from_file_location("toy_trainer", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules["toy_trainer"] = module
    spec.loader.exec_module(module)
    return module


def test_three_iterations_admit_only_samples_of_the_announced_step(
    simfleet_factory, operator, trainer_stack_url, transactional_db
):
    stack = build_stack(simfleet_factory, operator, trainer_stack_url)
    fleet = stack.fleet
    toy = load_example()
    settings = toy.Settings(
        control_url=stack.control_url,
        token=stack.token,
        endpoint=stack.endpoint,
        secrets=[stack.secret],
        source=stack.source,
        namespace=stack.namespace,
        frontend_url=stack.frontend_url,
        model=stack.model,
        batch=BATCH,
        generation_timeout=2.0,
    )
    original = {w["key"]: w["instance_id"] for w in fleet.workers()}
    restarted: dict[str, int] = {}

    def gate_open(step: int, version: str) -> None:
        if step == 1:
            # Every worker's first rollout hangs past the client's timeout (injected once the
            # refresh's own verification has generated): the retry must be the same attempt,
            # and only one sample may come of it.
            for key in original:
                fleet.inject(key, "generate", Fault(kind="latency", seconds=6.0, times=1))
        if step == 2:
            key = sorted(original)[0]
            restarted[key] = fleet.restart(key)  # back at base weights, with a new id

    def extra_instances(step: int) -> list[int]:
        return list(restarted.values())

    def before_announce(step: int) -> None:
        if step == 3:  # beat's periodic discovery has seen the restart by now
            discovery.run_discovery(source_pk, trigger=DiscoveryTrigger.MANUAL, wait=15)

    source_pk = Source.objects.get(name=stack.source).pk
    hooks = toy.Hooks(
        before_announce=before_announce, gate_open=gate_open, extra_instances=extra_instances
    )
    iterations = toy.train(settings, hooks)

    assert [it.version for it in iterations] == ["step-1", "step-2", "step-3"]
    for it in iterations:
        stamps = {v.sample.policy_version for v in it.admitted}
        assert stamps == {it.version}
        assert len(it.admitted) == BATCH, it.summary()

    (new_id,) = restarted.values()
    (old_id,) = [original[k] for k in restarted]

    by_key = {
        (c.request.rollout_id, c.request.attempt_id): c for it in iterations for c in it.completions
    }

    def served_by(verdict) -> int:
        reply = by_key[verdict.sample.key].reply
        return reply["nvext"]["worker_id"]["decode_worker_id"]

    one, two, three = iterations
    # Iteration 1: every worker's first send timed out and was sent again as the same attempt.
    assert one.summary()["retried_sends"] >= len(original)
    # Iteration 2: the restarted worker answered (at base weights) and nothing of it was
    # admitted; the instance that left was refused by the frontend and re-attempted elsewhere.
    from_restarted = [v for v in two.admitted + two.rejected if served_by(v) == new_id]
    assert from_restarted and all(not v.accepted for v in from_restarted)
    assert {r for v in from_restarted for r in v.failed_rules} == {"admitted"}
    assert any(str(old_id) in e for e in two.generation_errors)
    assert not [v for v in two.admitted if served_by(v) in (old_id, new_id)]
    # Iteration 3: the refresh caught it up to step-3; now its samples are admitted.
    assert [v for v in three.admitted if served_by(v) == new_id]

    # Zero duplicate admissions: each (rollout, attempt) admitted once, and a reply that
    # arrives again for an admitted attempt is refused by the guard.
    keys = [v.sample.key for it in iterations for v in it.admitted]
    assert len(keys) == len(set(keys))
    retried = next(c for c in one.completions if c.sends > 1)
    guard = AdmissionGuard()
    guard.admitted.update(keys)
    with ControlPlane(stack.control_url, source="sim", namespace="rl-a", token=stack.token) as cp:
        again = guard.admit_completion(retried, cp.admission_view())
    assert "duplicate" in again.failed_rules
