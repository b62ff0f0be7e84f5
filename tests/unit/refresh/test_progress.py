"""`PolicyRefresh.progress` is read and updated only through `refresh.progress`.

The helpers copy: a refresh's stored progress changes only when the caller stores the result
with its transition (under the row lock it holds), never as a side effect of reading.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

from controlplane.refresh.canary_review import review
from controlplane.refresh.models import PolicyRefresh
from controlplane.refresh.progress import (
    CANARY_AWAITING,
    CANARY_FAILED,
    CANARY_PASSED,
    CanaryReview,
    analysis_ref,
    canary_deadline,
    canary_of,
    leaving_pause_point,
    pause_is_requested,
    previous_policy,
    progress_of,
    waiting_after,
    with_canary,
    with_canary_analysis,
    with_canary_failed,
    with_canary_verdict,
    with_pause_requested,
    with_previous_policy,
)
from controlplane.textlimits import REASON_CHARS

ROOT = Path(__file__).resolve().parents[3] / "controlplane"
POLICY = {"weight_version": "v1", "method": "disk", "model_path": "/ckpt/v1"}


def refresh(progress=None, wave=1):
    return SimpleNamespace(progress=progress, wave=wave)


def test_reading_an_empty_progress_finds_nothing():
    empty = refresh(None)
    assert progress_of(empty) == {}
    assert canary_of(empty) is None
    assert previous_policy(empty) is None
    assert canary_deadline(empty) is None


def test_the_first_previous_policy_is_kept_on_a_retry():
    first = with_previous_policy(refresh({}), POLICY)
    assert first == {"previous_policy": POLICY, "previous_version": "v1"}
    again = with_previous_policy(refresh(first), {**POLICY, "weight_version": "v2"})
    assert again["previous_policy"] == POLICY
    assert again["previous_version"] == "v1"


def test_a_scope_without_a_verified_policy_remembers_none():
    assert with_previous_policy(refresh({}), None) == {
        "previous_policy": None,
        "previous_version": None,
    }


def test_a_pause_request_is_served_by_the_pause_point_and_left_with_its_wave():
    row = refresh({}, wave=2)
    requested = with_pause_requested(row)
    assert pause_is_requested(requested)
    assert row.progress == {}  # a copy: nothing is stored until the caller stores it
    waiting = waiting_after(requested, 2)
    assert not pause_is_requested(waiting)
    row.progress = waiting
    progress, after = leaving_pause_point(row)
    assert after == 2
    assert "waiting_after" not in progress
    assert row.progress["waiting_after"] == 2


def test_leaving_a_pause_point_without_one_recorded_goes_on_from_the_current_wave():
    assert leaving_pause_point(refresh({}, wave=3)) == ({}, 3)


def test_a_verdict_sets_the_state_and_keeps_what_the_review_said():
    awaiting = CanaryReview(
        state=CANARY_AWAITING, evaluation="manual", deadline="2026-01-01T00:00:00+00:00"
    )
    row = refresh(with_canary({}, awaiting))
    passed = with_canary_verdict(row, passed=True, metrics={"reward": 1.0}, by="ann", reason="")
    assert passed["canary"]["state"] == passed["canary"]["verdict"] == CANARY_PASSED
    assert passed["canary"]["deadline"] == awaiting["deadline"]
    assert passed["canary"]["metrics"] == {"reward": 1.0}
    failed = with_canary_verdict(row, passed=False, metrics=None, by="ann", reason="x" * 9000)
    assert failed["canary"]["state"] == CANARY_FAILED
    assert len(failed["canary"]["reason"]) == REASON_CHARS
    assert row.progress["canary"]["state"] == CANARY_AWAITING


def test_a_canary_that_fails_its_own_checks_has_no_verdict():
    failed = with_canary_failed(refresh({}), "generation differs", "executor@host")
    assert failed["canary"]["state"] == CANARY_FAILED
    assert "verdict" not in failed["canary"]


def test_canary_of_is_a_copy():
    row = refresh({"canary": {"state": CANARY_AWAITING}})
    review = canary_of(row)
    assert review is not None
    review["state"] = CANARY_PASSED
    assert row.progress["canary"]["state"] == CANARY_AWAITING


#: Where a progress key may be spelled outside `refresh/progress.py`, and why.
OUTSIDE = {
    # notify imports no feature app (import-linter): it reads the canary off the object it is
    # given, keys named as in `CanaryReview`.
    "notify/emit.py",
}
#: Reading the column in place (`refresh.progress or {}`, `.progress["x"]`, `.progress.get`), or
#: a key only the column has.
KEY_ACCESS = re.compile(
    r"\.progress\s*(or\b|\[|\.get\()"
    r"|[\"'](previous_policy|previous_version|pause_requested|waiting_after)[\"']"
)


def test_no_other_module_spells_a_progress_key():
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        relative = str(path.relative_to(ROOT))
        if relative in OUTSIDE or relative == "refresh/progress.py" or "/migrations/" in relative:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if KEY_ACCESS.search(line):
                found.append(f"{relative}:{number}: {line.strip()}")
    assert not found, "\n".join(found)


def test_the_progress_keeps_which_analysis_judges_the_canary_never_its_outcome():
    legacy = SimpleNamespace(
        progress={
            "canary": {
                "state": CANARY_AWAITING,
                # What an older version copied here: the outcome lives on the run's row.
                "analysis": {"run_id": 7, "template": "drift", "outcome": "pass", "score": 99},
            }
        }
    )
    assert analysis_ref(legacy) == {"run_id": 7, "template": "drift"}
    stored = with_canary_analysis(legacy, analysis_ref(legacy), state=CANARY_AWAITING)
    assert stored["canary"]["analysis"] == {"run_id": 7, "template": "drift"}


def test_an_analysis_concluded_without_a_run_keeps_its_outcome_in_the_reference():
    # No template left to make a run row with: the reference is the outcome's only record.
    refresh = PolicyRefresh(
        progress={
            "canary": {
                "state": CANARY_AWAITING,
                "needs_person": True,
                "analysis": {
                    "template": "drift",
                    "outcome": "inconclusive",
                    "score": None,
                    "summary": "template 'drift' is gone",
                },
            }
        }
    )
    assert review(refresh)["analysis"] == {
        "template": "drift",
        "outcome": "inconclusive",
        "score": None,
        "summary": "template 'drift' is gone",
    }
    assert canary_of(refresh)["analysis"]["outcome"] == "inconclusive"  # stored once, here
