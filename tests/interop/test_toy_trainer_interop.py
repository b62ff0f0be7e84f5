"""The toy training loop (`examples/toy_trainer.py`) on real Dynamo 1.6.1: the real frontend
with its RL listener, two real generation workers on the Dynamo runtime (the scripted
vLLM-style worker), the web server and a Celery worker in their own processes. Each of 3
iterations refreshes both workers through their real RL routes from a signed checkpoint
webhook, then generates pinned to the admitted instances, and every admitted sample carries
the announced step and the ids that step's policy emits."""

from __future__ import annotations

import pytest

from tests.integration.trainer.harness import trainer_stack_url, wire_stack
from tests.integration.trainer.test_toy_trainer import load_example
from tests.interop.conftest import WorkerSpec
from tests.interop.programs.synthetic_model import policy_tokens

pytestmark = [pytest.mark.interop, pytest.mark.celery]
__all__ = ["trainer_stack_url"]

MODEL = "tiny-policy"


def test_three_iterations_on_real_dynamo_admit_only_the_announced_step(
    dynamo_deployment, operator, trainer_stack_url, transactional_db
):
    dep = dynamo_deployment(
        [WorkerSpec("backend", namespace="rl-a", model_name=MODEL) for _ in range(2)],
        frontend_env={"DYN_NAMESPACE_PREFIX": "rl"},
    )
    stack = wire_stack(
        dep, dep.listener_url, dep.frontend_url, operator, trainer_stack_url, model=MODEL
    )
    toy = load_example()
    settings = toy.Settings(
        control_url=stack.control_url,
        token=stack.token,
        endpoint=stack.endpoint,
        secrets=[stack.secret],
        source=stack.source,
        namespace=stack.namespace,
        frontend_url=stack.frontend_url,
        model=MODEL,
        batch=4,
        max_tokens=5,
        gate_timeout=180,
    )
    iterations = toy.train(settings)

    assert [it.version for it in iterations] == ["step-1", "step-2", "step-3"]
    instances = {int(w["instance_id"]) for w in dep.listing()["workers"]}
    for it in iterations:
        assert len(it.admitted) == 4 and not it.rejected, it.summary()
        assert {v.sample.policy_version for v in it.admitted} == {it.version}
        for verdict in it.admitted:
            sample = verdict.sample
            expected = policy_tokens(it.version, list(sample.prompt_token_ids), 5)
            assert list(sample.completion_token_ids) == expected  # this step's policy
        served = {int(k) for k in it.summary()["served_by"]}
        assert served == instances
