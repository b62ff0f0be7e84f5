"""The simulated `logprob_jitter` fault: right weights under other batching numerics."""

from __future__ import annotations

import pytest

from controlplane.simfleet import Fault
from controlplane.simfleet.tokens import (
    NEAR_TIE_LOGPROB,
    completion_logprobs,
    expected_completion_ids,
    jittered_completion,
    token_logprob,
)

PROMPT = [5, 6, 7, 8]


def test_jitter_moves_logprobs_by_at_most_the_magnitude_and_keeps_the_ids():
    ids, logprobs = jittered_completion("v4", PROMPT, 8, magnitude=0.002, flip_from=None, seed="w")
    assert ids == expected_completion_ids("v4", PROMPT, 8)
    exact = completion_logprobs(ids)
    assert logprobs != exact
    assert max(abs(a - b) for a, b in zip(logprobs, exact, strict=True)) <= 0.002


def test_a_flip_happens_only_at_an_uncertain_position_and_is_a_near_tie():
    good = expected_completion_ids("v4", PROMPT, 8)
    ids, logprobs = jittered_completion("v4", PROMPT, 8, magnitude=0.002, flip_from=0, seed="w")
    pos = next(i for i, (a, b) in enumerate(zip(good, ids, strict=True)) if a != b)
    # The first position whose chosen token has probability at most one half.
    assert pos == next(i for i, t in enumerate(good) if token_logprob(t) <= NEAR_TIE_LOGPROB)
    assert ids[:pos] == good[:pos]
    assert abs(logprobs[pos] - token_logprob(good[pos])) <= 0.002
    # The rest continues greedily from the different prefix.
    assert ids[pos + 1 :] == expected_completion_ids("v4", [*PROMPT, *ids[: pos + 1]], 8 - pos - 1)


def test_fault_validates_its_parameters():
    assert Fault.logprob_jitter(0.01, flip_from=2).to_dict()["position"] == 2
    with pytest.raises(ValueError, match="magnitude"):
        Fault("logprob_jitter", magnitude=-1)
    with pytest.raises(ValueError, match="position"):
        Fault("logprob_jitter", position=-3)
