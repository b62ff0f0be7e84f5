"""Requests in flight at pause, read from what each backend reports (issue: the vLLM default was
`keep`, nothing counted what was drained, aborted or kept, SGLang's flush_cache passed through)."""

from __future__ import annotations

import pytest

from controlplane.dynamo.families import SGLANG, VLLM_SIDECAR, VLLM_WORKER
from controlplane.dynamo.families.base import Operation
from controlplane.dynamo.inflight import ABORTED, DRAINED, KEPT, InFlight, account


def test_the_vllm_families_drain_by_default():
    # Upstream's weight-update guide pauses with mode "wait": requests in flight finish on the
    # old weights. `keep` would let them continue on the new ones (two policies per sample).
    assert VLLM_WORKER.pause_mode_for("auto") == "wait"
    assert VLLM_SIDECAR.pause_mode_for("auto") == "wait"
    assert SGLANG.pause_mode_for("auto") == "abort"


def test_sglang_disk_update_always_resets_the_cache_and_says_what_happens_to_paused_requests():
    [call] = SGLANG.build(Operation.UPDATE_FROM_DISK, model_path="/m")
    assert call.body == {"model_path": "/m", "flush_cache": True, "abort_all_requests": True}
    [call] = SGLANG.build(Operation.UPDATE_FROM_DISK, model_path="/m", abort_all_requests=False)
    assert call.body["abort_all_requests"] is False
    with pytest.raises(ValueError, match="flush_cache=false would keep the old-weights"):
        SGLANG.build(Operation.UPDATE_FROM_DISK, model_path="/m", flush_cache=False)


@pytest.mark.parametrize(
    ("mode", "outcome"), [("wait", DRAINED), ("abort", ABORTED), ("keep", KEPT)]
)
def test_vllm_pause_reply_is_the_evidence(mode, outcome):
    reply = {"status": "ok", "message": "Engine paused", "mode": mode, "clear_cache": False}
    # The reply, not the request, says what the engine applied.
    got = account("vllm", [("pause", {"mode": "other"}, reply)])
    assert got == InFlight(outcome, mode, None, "vLLM pause reply", True)
    assert got.describe() == f"{outcome} (mode {mode}; vLLM pause reply)"


def test_sidecar_pause_reply_does_not_say_so_the_outcome_is_unconfirmed():
    got = account("vllm-sidecar", [("pause", {"mode": "wait"}, {"status": "paused"})])
    assert got is not None and (got.outcome, got.confirmed) == (DRAINED, False)
    assert got.describe().endswith("not confirmed by the worker")


def test_sglang_counts_paused_requests_and_whether_they_were_aborted():
    pause = ("pause", {"mode": "retract"}, {"status": "ok"})
    kept = (
        "update_from_disk",
        {"abort_all_requests": False},
        {"success": True, "num_paused_requests": 3},
    )
    dropped = (
        "update_from_disk",
        {"abort_all_requests": True},
        {"success": True, "num_paused_requests": 3},
    )
    assert account("sglang", [pause, kept]) == InFlight(
        KEPT, "retract", 3, "SGLang update reply (num_paused_requests)", True
    )
    got = account("sglang", [pause, dropped])
    assert (got.outcome, got.count) == (ABORTED, 3)
    assert got.describe() == "3 aborted (mode retract; SGLang update reply (num_paused_requests))"


def test_nothing_reported_means_no_accounting():
    assert account("vllm", [("pause", {}, {"status": "ok"})]) is None
    assert account("vllm", []) is None
