"""The toy loop through the `external` update method, on the live stack (web server, Celery
worker, Redis, PostgreSQL, simulated fleet): for each of 3 iterations the trainer announces an
external checkpoint, waits until the refresh has paused its workers (`ready_for_apply`), loads
the weights into each of them through the worker's own route as a framework would (no version
declared), reports `applied`, waits for the gate, generates pinned to admitted instances and
admits every sample with the guard. The control plane called no update route: it declared
the version, read it back, verified and reopened."""

from __future__ import annotations

import pytest

from controlplane.refresh.models import JournalEntry, PolicyRefresh, RefreshState
from tests.integration.trainer.harness import build_stack
from tests.integration.trainer.test_toy_trainer import BATCH, load_example

pytestmark = pytest.mark.celery


def test_three_external_iterations_apply_report_and_admit_only_the_announced_step(
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
        generation_timeout=5.0,
        update_method="external",
    )
    instances = {int(w["instance_id"]) for w in fleet.workers()}

    iterations = toy.train(settings)

    assert [it.version for it in iterations] == ["step-1", "step-2", "step-3"]
    for it in iterations:
        assert it.update_method == "external"
        assert set(it.applied_to) == instances
        assert len(it.admitted) == BATCH, it.summary()
        assert {v.sample.policy_version for v in it.admitted} == {it.version}
        refresh = PolicyRefresh.objects.get(pk=it.refresh_id)
        assert refresh.state == RefreshState.SUCCEEDED
        assert refresh.target["method"] == "external"
        assert refresh.progress["external"]["state"] == "applied"
        # The control plane only declared the version and read it back at update.
        update_calls = set(
            JournalEntry.objects.filter(refresh=refresh, step="update")
            .exclude(operation="discovery")
            .values_list("operation", flat=True)
        )
        assert update_calls == {"set_weight_version", "get_weight_version"}

    # The loads came from the trainer, once per worker and iteration, declaring no version.
    for worker in fleet.workers():
        loads = [
            c
            for c in fleet.state(worker["key"])["calls"]
            if c["route"] == "update_weights_from_disk"
        ]
        assert [c["body"] for c in loads] == [
            {"model_path": f"/checkpoints/toy/step-{k}"} for k in (1, 2, 3)
        ]
        assert worker["version"] == "step-3"
