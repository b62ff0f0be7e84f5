"""Worker steps: who gets called (retry touches only what did not succeed), what is recorded as
skipped and why, how a step judges its outcomes, and the takeover rule for the update.

The HTTP fan-out (`run_jobs`) is replaced by a recorder that answers every job as told; the
step's own selection, skip journal and verdict are what is tested.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from django.utils import timezone

from controlplane.fleet.models import Source
from controlplane.refresh.executor import departures
from controlplane.refresh.executor.calls import WorkerJob, WorkerOutcome
from controlplane.refresh.executor.step_base import StepContext, StepResult
from controlplane.refresh.executor.steps import (
    Flush,
    Pause,
    Update,
    Verify,
    WorkerStep,
    summarize_failures,
)
from controlplane.refresh.models import PlannedWorker, PolicyRefresh, WorkerStepResult
from controlplane.refresh.step_order import ORDER, STATE_STEP, STEP_STATE, WORKER_STEPS, next_step
from tests.unit.refresh.builders import DISK, call

PAUSE = [call("pause", "engine/pause_generation", {"mode": "keep"})]
UPDATE = [call("update_from_disk", "engine/update_weights_from_disk", {"model_path": "/ckpt/v7"})]
FLUSH = [call("flush_cache", "engine/flush_cache", {})]
SIDECAR_TARGET = {"weight_version": "v8", "method": "distributed", "group": {}, "update": {}}


class FanOut:
    """Stands in for the HTTP fan-out: records each batch, answers with `status` per job."""

    def __init__(self, status: dict[str, str] | None = None, aborted: bool = False):
        self.batches: list[tuple[str, list[WorkerJob]]] = []
        self.status = status or {}
        self.aborted = aborted

    def __call__(self, ctx, jobs, step=None):
        self.batches.append((str(step) if step else "", jobs))
        outcomes = [
            WorkerOutcome(
                j.planned_worker_id,
                j.key,
                self.status.get(j.key, "ok"),
                error="" if self.status.get(j.key, "ok") == "ok" else "HTTP 500: boom",
            )
            for j in jobs
        ]
        return SimpleNamespace(outcomes=outcomes, aborted=self.aborted)


def install(monkeypatch, step: WorkerStep, fan_out: FanOut) -> WorkerStep:
    monkeypatch.setattr(step, "run_jobs", fan_out)
    return step


@pytest.fixture
def refresh(db):
    source = Source.objects.create(
        name="fleet-a", listener_url="http://10.0.0.1:8001", allowed_networks=["10.0.0.0/8"]
    )
    return PolicyRefresh.objects.create(
        source=source, namespaces=["rl-a"], target=DISK, verification={"version_readback": True}
    )


def planned(refresh, name: str, family: str = "vllm", **calls) -> PlannedWorker:
    return PlannedWorker.objects.create(
        refresh=refresh,
        key=f"rl-a/backend/generate/{name}",
        namespace="rl-a",
        instance_id=name,
        system_url="http://10.0.0.5:9090",
        family=family,
        calls={"pause": PAUSE, "update": UPDATE, "flush": [], **calls},
        flush_skipped="" if "flush" in calls else "vllm update_from_disk already invalidates",
    )


def context(refresh, *, takeover: bool = False, attempt: int = 1) -> StepContext:
    def guard(**fields):
        # Applies the executor's fenced writes, as the real lease does with a live token.
        PolicyRefresh.objects.filter(pk=refresh.pk).update(**fields) if fields else None

    lease = SimpleNamespace(guard=guard, token=1, refresh_id=refresh.pk)
    return StepContext(refresh=refresh, lease=lease, cfg=None, attempt=attempt, takeover=takeover)


def results(refresh, step: str) -> dict[str, tuple[str, str]]:
    rows = WorkerStepResult.objects.filter(refresh=refresh, step=step).select_related(
        "planned_worker"
    )
    return {r.planned_worker.instance_id: (r.status, r.error) for r in rows}


def test_flush_skips_workers_whose_update_invalidated_and_calls_the_rest(refresh, monkeypatch):
    planned(refresh, "1")
    flushed = planned(refresh, "2", flush=FLUSH)
    fan_out = FanOut()
    result = install(monkeypatch, Flush(), fan_out).run(context(refresh))

    assert result == StepResult(True, detail="1 worker ok, 1 skipped")
    ((_, jobs),) = fan_out.batches
    assert [(j.key, j.calls) for j in jobs] == [(flushed.key, FLUSH)]
    assert results(refresh, "flush") == {
        "1": ("skipped", "vllm update_from_disk already invalidates")
    }


def test_a_retry_calls_only_workers_without_an_ok_or_skipped_result(refresh, monkeypatch):
    done, skipped, failed = planned(refresh, "1"), planned(refresh, "2"), planned(refresh, "3")
    for worker, status in ((done, "ok"), (skipped, "skipped"), (failed, "failed")):
        WorkerStepResult.objects.create(
            refresh=refresh,
            planned_worker=worker,
            step="pause",
            status=status,
            finished_at=timezone.now(),
        )
    # A retry reads the listener first (workers that left are not retried): all still listed.
    listed = {w.key for w in (done, skipped, failed)}
    monkeypatch.setattr(departures, "read_membership", lambda ctx, step: (listed, ""))
    fan_out = FanOut()
    result = install(monkeypatch, Pause(), fan_out).run(context(refresh, attempt=2))
    ((_, jobs),) = fan_out.batches
    assert [j.key for j in jobs] == [failed.key]
    assert jobs[0].calls == PAUSE
    # The summary does not read as if one worker was paused in all.
    assert result == StepResult(True, detail="1 worker ok this attempt; 2 already done earlier")


def test_a_later_waves_summary_says_which_wave_and_counts_the_earlier_ones(refresh, monkeypatch):
    PolicyRefresh.objects.filter(pk=refresh.pk).update(wave=2, waves=3)
    refresh.refresh_from_db()
    first = [planned(refresh, "1"), planned(refresh, "2")]
    PlannedWorker.objects.filter(pk__in=[w.pk for w in first]).update(wave=1)
    second = [planned(refresh, "3"), planned(refresh, "4")]
    PlannedWorker.objects.filter(pk__in=[w.pk for w in second]).update(wave=2)
    done = [*first, second[0]]  # wave 1 done; one of wave 2 done before a retry
    for worker in done:
        WorkerStepResult.objects.create(
            refresh=refresh,
            planned_worker=worker,
            step="update",
            status="ok",
            finished_at=timezone.now(),
        )
    fan_out = FanOut()
    result = install(monkeypatch, Update(), fan_out).run(context(refresh))
    ((_, jobs),) = fan_out.batches
    assert [j.key for j in jobs] == [second[1].key]
    assert result == StepResult(
        True,
        detail="wave 2 of 3: 1 worker ok this attempt; 1 already done earlier in this wave; "
        "2 done in earlier waves",
    )


def test_a_first_run_of_a_later_wave_reads_as_that_waves_work(refresh, monkeypatch):
    PolicyRefresh.objects.filter(pk=refresh.pk).update(wave=2, waves=2)
    refresh.refresh_from_db()
    earlier = planned(refresh, "1")
    PlannedWorker.objects.filter(pk=earlier.pk).update(wave=1)
    WorkerStepResult.objects.create(
        refresh=refresh,
        planned_worker=earlier,
        step="update",
        status="ok",
        finished_at=timezone.now(),
    )
    current = planned(refresh, "2")
    PlannedWorker.objects.filter(pk=current.pk).update(wave=2)
    result = install(monkeypatch, Update(), FanOut()).run(context(refresh))
    assert result == StepResult(True, detail="wave 2 of 2: 1 worker ok; 1 done in earlier waves")


def test_a_failed_worker_fails_the_step_and_is_named(refresh, monkeypatch):
    planned(refresh, "1")
    bad = planned(refresh, "2")
    fan_out = FanOut({bad.key: "failed"})
    result = install(monkeypatch, Pause(), fan_out).run(context(refresh))
    assert result == StepResult(
        False, f"pause failed on 1 of 2 workers — {bad.key}: HTTP 500: boom"
    )


def test_a_retry_that_fails_counts_the_whole_step_not_only_the_retried(refresh, monkeypatch):
    done = [planned(refresh, str(i)) for i in range(1, 12)]
    bad = planned(refresh, "12")
    for worker in done:
        WorkerStepResult.objects.create(
            refresh=refresh,
            planned_worker=worker,
            step="pause",
            status="ok",
            finished_at=timezone.now(),
        )
    listed = {w.key for w in [*done, bad]}
    monkeypatch.setattr(departures, "read_membership", lambda ctx, step: (listed, ""))
    fan_out = FanOut({bad.key: "failed"})
    result = install(monkeypatch, Pause(), fan_out).run(context(refresh, attempt=2))
    assert result == StepResult(
        False, f"pause failed on 1 of 12 workers — {bad.key}: HTTP 500: boom"
    )


@pytest.mark.parametrize(
    ("status", "aborted", "expected"),
    [
        (
            "unreached",
            True,
            StepResult(
                False,
                "0 calls cancelled (0 had reached the worker), 1 worker not called",
                aborted=True,
            ),
        ),
        ("ok", True, StepResult(True, aborted=True)),
        ("ok", False, StepResult(True, detail="1 worker ok")),
    ],
)
def test_an_abort_mid_step_is_reported_as_such(refresh, monkeypatch, status, aborted, expected):
    worker = planned(refresh, "1")
    fan_out = FanOut({worker.key: status}, aborted=aborted)
    assert install(monkeypatch, Pause(), fan_out).run(context(refresh)) == expected


def test_summaries_name_five_failures_and_count_the_rest():
    outcomes = [WorkerOutcome(i, f"w{i}", "failed", error="e") for i in range(7)]
    outcomes.append(WorkerOutcome(99, "fine", "ok"))
    assert summarize_failures("update", outcomes, 8) == (
        "update failed on 7 of 8 workers — w0: e; w1: e; w2: e; w3: e; w4: e (+2 more)"
    )


def test_takeover_refuses_to_repeat_an_update_that_is_not_idempotent(refresh, monkeypatch):
    refresh.target = SIDECAR_TARGET
    worker = planned(refresh, "1", family="vllm-sidecar")
    fan_out = FanOut()
    result = install(monkeypatch, Update(), fan_out).run(context(refresh, takeover=True))
    assert not result.ok
    # A collective group cannot be half-repeated: the whole group must be re-formed.
    assert worker.key
    assert result.reason == (
        "executor lost during a distributed update: the group's state is unknown; "
        "retry to re-form it on every rank (group torn down on 0 of 0 ranks with a destroy "
        "route)"
    )
    assert fan_out.batches == []  # no update was repeated
    refresh.refresh_from_db()
    assert refresh.group["state"] == "torn_down"


def test_takeover_re_pauses_before_repeating_an_idempotent_update(refresh, monkeypatch):
    worker = planned(refresh, "1")
    fan_out = FanOut()
    result = install(monkeypatch, Update(), fan_out).run(context(refresh, takeover=True))
    assert result.ok
    assert [(step, [j.calls for j in jobs]) for step, jobs in fan_out.batches] == [
        ("pause", [PAUSE]),
        ("", [UPDATE]),
    ]
    assert fan_out.batches[0][1][0].key == worker.key


def test_takeover_stops_when_the_re_pause_fails(refresh, monkeypatch):
    worker = planned(refresh, "1")
    fan_out = FanOut({worker.key: "failed"})
    result = install(monkeypatch, Update(), fan_out).run(context(refresh, takeover=True))
    assert result.reason.startswith("re-pause before repeating the update: pause failed on 1 of 1")
    assert len(fan_out.batches) == 1  # the update itself was not sent


@pytest.mark.parametrize("readback", [True, False])
def test_verify_expects_the_target_version_only_when_reading_it_back(refresh, readback):
    refresh.verification = {"version_readback": readback}
    worker = planned(refresh, "1", verify=[call("get_weight_version", "engine/x", {})])
    job = Verify().job(context(refresh), worker)
    assert job.calls == [call("get_weight_version", "engine/x", {})]
    if readback:
        assert job.expect_version == "v7"
    else:
        assert job.expect_version is WorkerJob.__dataclass_fields__["expect_version"].default


def test_the_sequence_runs_the_worker_steps_in_order_between_gate_and_reopen():
    assert ORDER[0] == "gate" and ORDER[-1] == "reopen" and "release" not in ORDER
    assert [s for s in ORDER if s in WORKER_STEPS] == list(WORKER_STEPS)
    assert next_step(ORDER[-1]) is None
    assert [next_step(s) for s in ORDER[:-1]] == list(ORDER[1:])
    assert all(STATE_STEP[STEP_STATE[s]] == s for s in STEP_STATE)
