"""The rules that tell right weights from wrong ones: cross-worker agreement, trainer
fingerprints, and the untrusted input they are built from."""

from __future__ import annotations

import math

import pytest

from controlplane.dynamo.fingerprint import (
    AgreementRule,
    Fingerprint,
    Sample,
    cross_check,
    fingerprint_from_text,
)
from controlplane.dynamo.generation import GenerationCheck, completion_sample, evaluate_completion

GOOD = (101, 102, 103, 104, 105, 106, 107, 108)
WRONG = (901, 902, 903, 904, 905, 906, 907, 908)
#: Uncertain tokens (probability below one half), as at a real near-tie.
UNSURE = (-0.9, -0.8, -0.75, -0.9, -0.8, -0.95, -0.85, -0.9)
EXACT = AgreementRule()
LOGPROB = AgreementRule(kind="logprob", tokens=8, epsilon=0.01)


def sample(key: str, ids=GOOD, logprobs=UNSURE) -> Sample:
    return Sample(key, tuple(ids), tuple(logprobs) if logprobs is not None else None)


def odd_keys(check) -> list[str]:
    return [o.key for o in check.odd]


# -- exact agreement ------------------------------------------------------------------------------


def test_default_rule_is_exact_agreement_on_the_first_eight_tokens():
    assert EXACT.to_dict() == {"kind": "exact", "tokens": 8, "epsilon": 0.05}
    assert EXACT.describe() == "exact agreement on the first 8 tokens"


def test_identical_completions_agree():
    check = cross_check([sample("a"), sample("b"), sample("c")], EXACT)
    assert check.ok and check.compared == 3
    assert check.detail == "3 workers agree (exact agreement on the first 8 tokens)"


def test_the_odd_worker_is_named_against_the_plurality():
    check = cross_check([sample("a"), sample("b"), sample("bad", WRONG), sample("c")], EXACT)
    assert odd_keys(check) == ["bad"]
    assert check.reference_ids == GOOD and check.reference_size == 3
    (odd,) = check.odd
    assert "differs at token 0" in odd.reason
    assert "got [901, 902" in odd.reason and "reference [101, 102" in odd.reason
    assert "(3 of 4 agree)" in odd.reason


def test_a_difference_after_the_window_is_not_compared():
    late = (*GOOD, 1)
    other = (*GOOD, 2)
    assert cross_check([sample("a", late), sample("b", other)], EXACT).ok


def test_a_difference_inside_a_short_window_counts():
    rule = AgreementRule(tokens=3)
    check = cross_check([sample("a"), sample("b"), sample("c", (101, 102, 999))], rule)
    assert odd_keys(check) == ["c"] and "differs at token 2" in check.odd[0].reason


def test_two_workers_that_disagree_are_both_named():
    check = cross_check([sample("a"), sample("b", WRONG)], EXACT)
    assert check.ambiguous
    assert sorted(odd_keys(check)) == ["a", "b"]
    assert "no plurality" in check.odd[0].reason


def test_an_even_split_has_no_plurality():
    samples = [sample("a"), sample("b"), sample("c", WRONG), sample("d", WRONG)]
    check = cross_check(samples, EXACT)
    assert check.ambiguous and len(check.odd) == 4


def test_a_plurality_without_a_majority_is_still_the_reference():
    other = (1, 2, 3, 4, 5, 6, 7, 8)
    samples = [sample("a"), sample("b"), sample("c", WRONG), sample("d", other)]
    check = cross_check(samples, EXACT)
    assert not check.ambiguous and sorted(odd_keys(check)) == ["c", "d"]


def test_a_single_worker_is_reported_as_not_cross_checked():
    check = cross_check([sample("only")], EXACT)
    assert check.ok and check.compared == 1
    assert check.detail == "1 worker, no cross-check"


def test_an_early_stop_differs_from_a_longer_completion():
    check = cross_check([sample("a"), sample("b"), sample("short", GOOD[:5])], EXACT)
    assert odd_keys(check) == ["short"] and "differs at token 5" in check.odd[0].reason


# -- logprob distance bound ----------------------------------------------------------------------


def jitter(values, delta):
    return tuple(v + (delta if i % 2 else -delta) for i, v in enumerate(values))


def test_logprob_rule_accepts_numeric_jitter_within_epsilon():
    samples = [sample("a"), sample("b", logprobs=jitter(UNSURE, 0.004)), sample("c")]
    assert cross_check(samples, LOGPROB).ok


def test_logprob_rule_holds_a_gap_beyond_epsilon():
    far = (*UNSURE[:3], UNSURE[3] + 0.2, *UNSURE[4:])
    check = cross_check([sample("a"), sample("b"), sample("drift", logprobs=far)], LOGPROB)
    assert odd_keys(check) == ["drift"]
    assert "logprob at token 3" in check.odd[0].reason and "> ε 0.01" in check.odd[0].reason


def test_a_near_tie_flip_passes_the_logprob_rule_but_not_the_exact_rule():
    # Same weights, other batching: token 4 was a near-tie and flipped; the rest continues
    # a different prefix.
    flipped_ids = (*GOOD[:4], 555, 556, 557, 558)
    flipped_lp = (*jitter(UNSURE[:4], 0.002), UNSURE[4] - 0.003, -0.1, -0.2, -0.3)
    samples = [sample("a"), sample("b"), sample("flip", flipped_ids, flipped_lp)]
    assert cross_check(samples, LOGPROB).ok
    exact = cross_check(samples, EXACT)
    assert odd_keys(exact) == ["flip"] and "differs at token 4" in exact.odd[0].reason


def test_a_confident_divergence_is_no_near_tie():
    confident = (-0.05,) * 8
    wrong_lp = (-0.052,) + (-0.05,) * 7
    samples = [
        sample("a", logprobs=confident),
        sample("b", logprobs=confident),
        sample("bad", WRONG, wrong_lp),
    ]
    check = cross_check(samples, LOGPROB)
    assert odd_keys(check) == ["bad"] and "no near-tie" in check.odd[0].reason


def test_wrong_tokens_with_different_logprobs_fail_the_logprob_rule():
    wrong_lp = (-0.2, -3.0, -0.4, -1.5, -0.1, -0.3, -2.0, -0.6)
    check = cross_check([sample("a"), sample("b"), sample("bad", WRONG, wrong_lp)], LOGPROB)
    assert odd_keys(check) == ["bad"]


def test_logprob_rule_needs_logprobs():
    check = cross_check([sample("a"), sample("b"), sample("bare", logprobs=None)], LOGPROB)
    assert odd_keys(check) == ["bare"] and "carries no logprobs" in check.odd[0].reason


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kind": "fuzzy"}, "agreement rule must be one of"),
        ({"tokens": 0}, "agreement tokens"),
        ({"tokens": 257}, "agreement tokens"),
        ({"tokens": True}, "agreement tokens"),
        ({"epsilon": 0}, "agreement epsilon"),
        ({"epsilon": math.nan}, "agreement epsilon"),
        ({"epsilon": math.inf}, "agreement epsilon"),
    ],
)
def test_agreement_rule_refuses_bad_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AgreementRule(**kwargs)


# -- trainer fingerprint --------------------------------------------------------------------------


def test_fingerprint_round_trips_and_defaults_the_tolerance():
    fp = Fingerprint.from_dict({"completion_token_ids": [1, 2], "logprobs": [-0.5, 0]})
    assert fp.to_dict() == {
        "completion_token_ids": [1, 2],
        "logprobs": [-0.5, 0.0],
        "logprob_tolerance": 0.05,
    }
    assert fp.length == 2


def test_fingerprint_names_the_first_differing_token():
    fp = Fingerprint.from_dict({"completion_token_ids": [101, 102, 103]})
    assert fp.mismatch([101, 102, 103, 104], None) is None
    problem = fp.mismatch([101, 7, 103], None)
    assert problem == (
        "trainer fingerprint: completion differs at token 1: "
        "expected [101, 102, 103], got [101, 7, 103]"
    )
    assert "differs at token 2" in fp.mismatch([101, 102], None)


def test_fingerprint_logprobs_are_compared_within_the_tolerance():
    fp = Fingerprint.from_dict({"logprobs": [-0.5, -1.0], "logprob_tolerance": 0.01})
    assert fp.mismatch([1, 2], [-0.505, -0.991]) is None
    problem = fp.mismatch([1, 2], [-0.5, -1.2])
    assert "logprob at token 1 is -1.2000, expected -1.0000" in problem
    assert "reply carries none" in fp.mismatch([1, 2], None)
    assert "1 logprobs in the reply, 2 reference values" in fp.mismatch([1], [-0.5])


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([1, 2], "must be an object"),
        ({}, "needs completion_token_ids and/or logprobs"),
        ({"logprob_tolerance": 0.1}, "needs completion_token_ids and/or logprobs"),
        ({"completion_token_ids": []}, "must not be empty"),
        ({"completion_token_ids": list(range(257))}, "at most 256"),
        ({"completion_token_ids": [1, True]}, r"completion_token_ids\[1\]"),
        ({"completion_token_ids": [1, -1]}, r"completion_token_ids\[1\]"),
        ({"completion_token_ids": [2**32]}, r"completion_token_ids\[0\]"),
        ({"completion_token_ids": [1.0]}, r"completion_token_ids\[0\]"),
        ({"completion_token_ids": "1,2"}, "must be a list"),
        ({"logprobs": [math.nan]}, "finite number"),
        ({"logprobs": [-math.inf]}, "finite number"),
        ({"logprobs": [0.5]}, "at most 0"),
        ({"logprobs": ["-0.5"]}, "finite number"),
        ({"logprobs": [-0.1] * 257}, "at most 256"),
        ({"logprobs": [-0.1], "logprob_tolerance": 0}, "logprob_tolerance"),
        ({"logprobs": [-0.1], "logprob_tolerance": math.inf}, "logprob_tolerance"),
        ({"logprobs": [-0.1], "logprob_tolerance": 11}, "logprob_tolerance"),
        ({"completion_token_ids": [1], "prompt_token_ids": []}, "prompt_token_ids"),
        ({"completion_token_ids": [1], "seed": 3}, "unknown fingerprint fields: seed"),
    ],
)
def test_fingerprint_refuses_bad_input(data, message):
    with pytest.raises(ValueError, match=message):
        Fingerprint.from_dict(data)


def test_fingerprint_from_text_parses_the_command_line_and_form_syntax():
    assert fingerprint_from_text("") is None
    assert fingerprint_from_text(" 1, 2,3 ", "-0.1,-0.2", "0.02") == {
        "completion_token_ids": [1, 2, 3],
        "logprobs": [-0.1, -0.2],
        "logprob_tolerance": 0.02,
    }
    for tokens, logprobs, tolerance, message in [
        ("1,x", "", None, "expected tokens must be integers"),
        ("1.5", "", None, "expected tokens must be integers"),
        ("", "nan", None, "finite number"),
        ("", "1e999", None, "finite number"),
        ("", "-0.1", "lots", "logprob tolerance must be a number"),
        (",".join(["1"] * 300), "", None, "at most 256"),
    ]:
        with pytest.raises(ValueError, match=message):
            fingerprint_from_text(tokens, logprobs, tolerance)


# -- the generation check with a fingerprint -----------------------------------------------------


def reply(ids, logprobs=None):
    choice = {"text": "x", "index": 0, "finish_reason": "length"}
    if logprobs is not None:
        choice["logprobs"] = {
            "tokens": ["t"] * len(ids),
            "token_logprobs": list(logprobs),
            "top_logprobs": [],
            "text_offset": [],
        }
    return {
        "model": "m",
        "choices": [choice],
        "nvext": {
            "completion_token_ids": list(ids),
            "prompt_token_ids": [5, 6],
            "detailed_finish_reason": "length",
        },
    }


def test_generation_check_fails_a_worker_that_misses_the_trainer_fingerprint():
    fp = Fingerprint.from_dict({"completion_token_ids": [1, 2, 3]})
    check = GenerationCheck("m", (5, 6), max_tokens=3, fingerprint=fp)
    assert evaluate_completion(check, 200, reply([1, 2, 3])).ok
    verdict = evaluate_completion(check, 200, reply([1, 9, 3]))
    assert not verdict.ok
    assert verdict.reason.startswith("trainer fingerprint: completion differs at token 1")


def test_generation_check_without_fingerprint_still_passes_any_well_formed_completion():
    # What main did for every worker; the cross-check is what catches this now.
    check = GenerationCheck("m", (5, 6), max_tokens=3)
    assert evaluate_completion(check, 200, reply([7, 8, 9])).ok


def test_completion_sample_reads_ids_and_logprobs_back_from_a_stored_reply():
    assert completion_sample("w", reply([1, 2], [-0.1, -0.2])) == Sample("w", (1, 2), (-0.1, -0.2))
    assert completion_sample("w", reply([1, 2])) == Sample("w", (1, 2), None)
    assert completion_sample("w", {"choices": []}) is None
    assert completion_sample("w", None) is None
