"""Telling right weights from wrong ones: cross-worker agreement and trainer fingerprints.

A generation check that only validates a reply's shape passes a worker that loaded the wrong
weights. Two independent references close that gap:

- **Cross-worker agreement.** At temperature 0 on the same token prompt, workers serving the
  same policy should produce the same completion. The plurality of workers is the reference and
  the odd ones out are named. It cannot catch a fleet that is *uniformly* wrong, and a single
  worker has nobody to agree with (reported as such, never as a pass).
- **Trainer fingerprint.** The trainer, who has the weights, supplies the expected completion
  ids and/or the chosen tokens' log-probabilities for the verification prompt. Every worker is
  compared with it, so a uniformly wrong fleet is caught too.

Greedy decoding is not bit-identical across replicas: batch composition changes the order of
floating-point reductions, so log-probabilities jitter (typically ~1e-3 nats in bf16) and, at a
near-tie between the two best tokens, the argmax can flip. The longer the completion, the more
near-ties it crosses, so the comparison looks at a short prefix (`k` tokens) and the rule is
explicit per source:

- `exact` (default): the first `k` completion ids must be identical. `k = 8` is short enough
  that a near-tie flip among healthy replicas is rare on a fixed prompt, and long enough that a
  worker with wrong or corrupted weights reproducing 8 greedy tokens by chance is negligible
  (each position is one of tens of thousands of ids).
- `logprob`: position by position over the first `k` tokens, the chosen tokens'
  log-probabilities differ by at most `epsilon`. Ids may differ only through a genuine near-tie:
  at the first differing position both chosen tokens have probability at most one half (two
  tokens that are within epsilon of each other cannot both be above 0.5) and log-probabilities
  within `epsilon`; later positions continue different prefixes, so comparison stops there. Use
  it where replicas run under very different batching and `exact` gives false holds.

Plain Python, no Django: the executor feeds it samples read from the journal.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

EXACT = "exact"
LOGPROB = "logprob"
RULE_KINDS = (EXACT, LOGPROB)
DEFAULT_RULE = EXACT
DEFAULT_AGREEMENT_TOKENS = 8
DEFAULT_EPSILON = 0.05
DEFAULT_LOGPROB_TOLERANCE = 0.05
#: Upper bound on every token list we accept from outside (trainer, forms, API, CLI).
MAX_FINGERPRINT_TOKENS = 256
MAX_TOLERANCE = 10.0
#: Token ids are unsigned 32-bit in every engine Dynamo fronts.
MAX_TOKEN_ID = 2**32 - 1
#: A token that wins a near-tie has probability at most one half.
NEAR_TIE_CEILING = math.log(0.5)
#: How many ids a message quotes before eliding.
QUOTED_TOKENS = 12


def quote(ids: Sequence[Any], limit: int = QUOTED_TOKENS) -> str:
    shown = ", ".join(str(i) for i in list(ids)[:limit])
    return f"[{shown}{', …' if len(ids) > limit else ''}]"


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def parse_token_ids(raw: Any, what: str, *, limit: int = MAX_FINGERPRINT_TOKENS) -> tuple[int, ...]:
    """A bounded list of token ids; raises ValueError with a message a person can act on."""
    if not isinstance(raw, list | tuple):
        raise ValueError(f"{what} must be a list of token ids")
    if not raw:
        raise ValueError(f"{what} must not be empty")
    if len(raw) > limit:
        raise ValueError(f"{what} has {len(raw)} ids; at most {limit} are accepted")
    for index, value in enumerate(raw):
        if not _is_int(value) or not 0 <= value <= MAX_TOKEN_ID:
            raise ValueError(
                f"{what}[{index}] must be an integer token id in 0..{MAX_TOKEN_ID}, "
                f"got {str(value)[:40]!r}"
            )
    return tuple(raw)


def parse_logprobs(raw: Any, what: str) -> tuple[float, ...]:
    if not isinstance(raw, list | tuple):
        raise ValueError(f"{what} must be a list of numbers")
    if not raw:
        raise ValueError(f"{what} must not be empty")
    if len(raw) > MAX_FINGERPRINT_TOKENS:
        raise ValueError(
            f"{what} has {len(raw)} values; at most {MAX_FINGERPRINT_TOKENS} are accepted"
        )
    for index, value in enumerate(raw):
        if not _is_number(value) or not math.isfinite(value):
            raise ValueError(f"{what}[{index}] must be a finite number, got {str(value)[:40]!r}")
        if value > 0:
            raise ValueError(f"{what}[{index}] is {value!r}: a log-probability is at most 0")
    return tuple(float(v) for v in raw)


def parse_positive(raw: Any, what: str, *, maximum: float) -> float:
    if not _is_number(raw) or not math.isfinite(raw) or not 0 < raw <= maximum:
        raise ValueError(f"{what} must be a finite number in (0, {maximum:g}], got {raw!r}")
    return float(raw)


# -- samples ------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Sample:
    """One worker's verified completion: ids and, when the engine reported them, logprobs."""

    key: str
    ids: tuple[int, ...]
    logprobs: tuple[float, ...] | None = None


@dataclass(frozen=True, slots=True)
class Difference:
    """Why two completions do not agree under a rule; `position` is the first bad token."""

    position: int
    reason: str


# -- the agreement rule -------------------------------------------------------------------------
class AgreementRuleJson(TypedDict):
    """`AgreementRule.to_dict()`: stored in `PolicyRefresh.verification["agreement"]`."""

    kind: str
    tokens: int
    epsilon: float


@dataclass(frozen=True, slots=True)
class AgreementRule:
    """How two workers' completions must agree: `exact` ids or a logprob distance bound."""

    kind: str = DEFAULT_RULE
    tokens: int = DEFAULT_AGREEMENT_TOKENS
    epsilon: float = DEFAULT_EPSILON

    def __post_init__(self) -> None:
        if self.kind not in RULE_KINDS:
            raise ValueError(f"agreement rule must be one of {', '.join(RULE_KINDS)}")
        if not _is_int(self.tokens) or not 1 <= self.tokens <= MAX_FINGERPRINT_TOKENS:
            raise ValueError(
                f"agreement tokens must be an integer in 1..{MAX_FINGERPRINT_TOKENS}, "
                f"got {self.tokens!r}"
            )
        parse_positive(self.epsilon, "agreement epsilon", maximum=MAX_TOLERANCE)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> AgreementRule:
        data = data or {}
        return cls(
            kind=data.get("kind", DEFAULT_RULE),
            tokens=data.get("tokens", DEFAULT_AGREEMENT_TOKENS),
            epsilon=data.get("epsilon", DEFAULT_EPSILON),
        )

    def to_dict(self) -> AgreementRuleJson:
        return {"kind": self.kind, "tokens": self.tokens, "epsilon": self.epsilon}

    def describe(self) -> str:
        if self.kind == EXACT:
            return f"exact agreement on the first {self.tokens} tokens"
        return f"chosen-token logprobs within {self.epsilon:g} over the first {self.tokens} tokens"

    def compare(self, reference: Sample, other: Sample) -> Difference | None:
        """None when `other` agrees with `reference` under this rule."""
        a, b = reference.ids[: self.tokens], other.ids[: self.tokens]
        if self.kind == EXACT:
            if a == b:
                return None
            pos = _first_difference(a, b)
            return Difference(pos, _id_difference(pos, a, b))
        return self._compare_logprobs(reference, other)

    def _compare_logprobs(self, reference: Sample, other: Sample) -> Difference | None:
        if reference.logprobs is None or other.logprobs is None:
            who = "this worker's reply" if other.logprobs is None else "the reference"
            return Difference(0, f"{who} carries no logprobs; the logprob rule needs them")
        a, b = reference.ids[: self.tokens], other.ids[: self.tokens]
        la, lb = reference.logprobs[: len(a)], other.logprobs[: len(b)]
        for pos in range(min(len(a), len(b))):
            if pos >= len(la) or pos >= len(lb):
                return Difference(pos, f"no logprob for token {pos}")
            gap = abs(la[pos] - lb[pos])
            if gap > self.epsilon:
                return Difference(
                    pos,
                    f"logprob at token {pos} is {lb[pos]:.4f}, reference {la[pos]:.4f} "
                    f"(|Δ| {gap:.4f} > ε {self.epsilon:g})",
                )
            if a[pos] != b[pos]:
                if max(la[pos], lb[pos]) > NEAR_TIE_CEILING + self.epsilon:
                    return Difference(
                        pos,
                        f"token {pos} is {b[pos]}, reference {a[pos]}, and one of them has "
                        f"probability above 0.5, so this is no near-tie",
                    )
                # A near-tie flip; the rest continues a different prefix and is not comparable.
                return None
        if len(a) != len(b):
            pos = min(len(a), len(b))
            return Difference(pos, _id_difference(pos, a, b))
        return None


def _first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    for pos, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return pos
    return min(len(a), len(b))


def _id_difference(pos: int, reference: Sequence[int], got: Sequence[int]) -> str:
    return f"differs at token {pos}: got {quote(got)}, reference {quote(reference)}"


# -- cross-worker agreement ---------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class OddWorker:
    key: str
    reason: str
    ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class CrossCheck:
    """The outcome of comparing one model's workers. `odd` empty means they agree."""

    rule: AgreementRule
    compared: int
    odd: tuple[OddWorker, ...] = ()
    reference_ids: tuple[int, ...] = ()
    reference_size: int = 0
    #: No plurality: the largest agreeing groups tie, so nobody can be called right.
    ambiguous: bool = False
    detail: str = field(default="")

    @property
    def ok(self) -> bool:
        return not self.odd


def _reference_of(rule: AgreementRule, members: list[Sample]) -> Sample:
    """A bucket's representative: its ids, with per-position median logprobs (robust to one
    jittery member)."""
    ids = members[0].ids[: rule.tokens]
    measured = [m.logprobs for m in members if m.logprobs is not None]
    if not measured:
        return Sample("reference", ids, None)
    width = min(len(ids), *(len(lp) for lp in measured))
    medians = tuple(statistics.median(lp[i] for lp in measured) for i in range(width))
    return Sample("reference", ids, medians)


def cross_check(samples: Iterable[Sample], rule: AgreementRule) -> CrossCheck:
    """Compare workers of one model under `rule`; the plurality is the reference."""
    samples = list(samples)
    n = len(samples)
    if n < 2:
        return CrossCheck(rule, n, detail=f"{n} worker, no cross-check")
    buckets: dict[tuple[int, ...], list[Sample]] = {}
    for sample in samples:
        buckets.setdefault(sample.ids[: rule.tokens], []).append(sample)
    # Each bucket's representative, with the set of workers that agree with it under the rule.
    candidates: list[tuple[Sample, frozenset[str]]] = []
    for members in buckets.values():
        reference = _reference_of(rule, members)
        if rule.kind == EXACT:
            agreeing = frozenset(m.key for m in members)
        else:
            agreeing = frozenset(s.key for s in samples if rule.compare(reference, s) is None)
        candidates.append((reference, agreeing))
    candidates.sort(key=lambda c: len(c[1]), reverse=True)
    best_reference, best = candidates[0]
    rivals = [c for c in candidates[1:] if len(c[1]) == len(best) and c[1] != best]
    if rivals or not best:
        odd = tuple(
            OddWorker(
                s.key,
                f"no plurality among {n} workers ({len(buckets)} distinct completions): "
                f"got {quote(s.ids[: rule.tokens])}",
                s.ids,
            )
            for s in samples
        )
        return CrossCheck(
            rule,
            n,
            odd,
            ambiguous=True,
            detail=f"{n} workers, no plurality ({len(buckets)} distinct completions)",
        )
    odd_list = []
    for sample in samples:
        if sample.key in best:
            continue
        difference = rule.compare(best_reference, sample)
        why = difference.reason if difference else "does not agree with the reference"
        odd_list.append(OddWorker(sample.key, f"{why} ({len(best)} of {n} agree)", sample.ids))
    detail = (
        f"{n} workers agree ({rule.describe()})"
        if not odd_list
        else f"{len(odd_list)} of {n} workers disagree with the other {len(best)}"
    )
    return CrossCheck(
        rule,
        n,
        tuple(odd_list),
        reference_ids=best_reference.ids,
        reference_size=len(best),
        detail=detail,
    )


# -- trainer fingerprint ------------------------------------------------------------------------
class FingerprintJson(TypedDict, total=False):
    """`Fingerprint.to_dict()`, as `PolicyRefresh.fingerprint` and a plan's verify call keep it."""

    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    logprobs: list[float]
    logprob_tolerance: float


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """What the trainer says the new policy generates for the verification prompt.

    `prompt_token_ids` (optional) replaces the refresh's verification prompt, so the trainer
    can fingerprint a prompt it chose. At least one of `completion_token_ids` (compared
    exactly) and `logprobs` (each within `logprob_tolerance`) is required.
    """

    completion_token_ids: tuple[int, ...] = ()
    logprobs: tuple[float, ...] = ()
    logprob_tolerance: float = DEFAULT_LOGPROB_TOLERANCE
    prompt_token_ids: tuple[int, ...] = ()

    @classmethod
    def from_dict(cls, data: Any) -> Fingerprint:
        """Validate untrusted input; raises ValueError naming the offending field."""
        if not isinstance(data, Mapping):
            raise ValueError("fingerprint must be an object")
        known = {"completion_token_ids", "logprobs", "logprob_tolerance", "prompt_token_ids"}
        unknown = sorted(str(k)[:40] for k in data if k not in known)
        if unknown:
            raise ValueError(f"unknown fingerprint fields: {', '.join(unknown)}")
        ids = data.get("completion_token_ids")
        logprobs = data.get("logprobs")
        if ids is None and logprobs is None:
            raise ValueError("a fingerprint needs completion_token_ids and/or logprobs")
        tolerance = data.get("logprob_tolerance")
        prompt = data.get("prompt_token_ids")
        return cls(
            completion_token_ids=(
                parse_token_ids(ids, "completion_token_ids") if ids is not None else ()
            ),
            logprobs=parse_logprobs(logprobs, "logprobs") if logprobs is not None else (),
            logprob_tolerance=(
                parse_positive(tolerance, "logprob_tolerance", maximum=MAX_TOLERANCE)
                if tolerance is not None
                else DEFAULT_LOGPROB_TOLERANCE
            ),
            prompt_token_ids=(
                parse_token_ids(prompt, "prompt_token_ids") if prompt is not None else ()
            ),
        )

    def to_dict(self) -> FingerprintJson:
        data: FingerprintJson = {}
        if self.prompt_token_ids:
            data["prompt_token_ids"] = list(self.prompt_token_ids)
        if self.completion_token_ids:
            data["completion_token_ids"] = list(self.completion_token_ids)
        if self.logprobs:
            data["logprobs"] = list(self.logprobs)
            data["logprob_tolerance"] = self.logprob_tolerance
        return data

    @property
    def length(self) -> int:
        """How many completion tokens a worker must generate to be compared."""
        return max(len(self.completion_token_ids), len(self.logprobs))

    def mismatch(self, ids: Sequence[int], logprobs: Sequence[float] | None) -> str | None:
        """Why this completion is not the trainer's policy, or None."""
        expected = self.completion_token_ids
        if expected:
            got = tuple(ids[: len(expected)])
            if got != expected:
                pos = _first_difference(expected, got)
                return (
                    f"trainer fingerprint: completion differs at token {pos}: "
                    f"expected {quote(expected)}, got {quote(got)}"
                )
        reference = self.logprobs
        if reference:
            if logprobs is None:
                return "trainer fingerprint has reference logprobs but the reply carries none"
            if len(logprobs) < len(reference):
                return (
                    f"trainer fingerprint: {len(logprobs)} logprobs in the reply, "
                    f"{len(reference)} reference values"
                )
            for pos, (want, have) in enumerate(zip(reference, logprobs, strict=False)):
                gap = abs(want - have)
                if gap > self.logprob_tolerance:
                    return (
                        f"trainer fingerprint: logprob at token {pos} is {have:.4f}, "
                        f"expected {want:.4f} (|Δ| {gap:.4f} > tolerance "
                        f"{self.logprob_tolerance:g})"
                    )
        return None

    def describe(self) -> str:
        parts = []
        if self.completion_token_ids:
            parts.append(f"{len(self.completion_token_ids)} expected ids")
        if self.logprobs:
            parts.append(f"{len(self.logprobs)} reference logprobs (± {self.logprob_tolerance:g})")
        if self.prompt_token_ids:
            parts.append(f"on prompt {quote(self.prompt_token_ids)}")
        return ", ".join(parts)


def _csv_items(text: str) -> list[str]:
    return [part.strip() for part in text.replace("\n", ",").split(",") if part.strip()]


def fingerprint_from_text(
    tokens: str = "", logprobs: str = "", tolerance: float | str | None = None
) -> FingerprintJson | None:
    """A fingerprint from comma-separated text (the plan form, the command line).

    Returns None when neither list is given; raises ValueError naming the bad item.
    """
    data: dict[str, Any] = {}
    token_items, logprob_items = _csv_items(tokens or ""), _csv_items(logprobs or "")
    for name, items, limit in (
        ("expected tokens", token_items, MAX_FINGERPRINT_TOKENS),
        ("reference logprobs", logprob_items, MAX_FINGERPRINT_TOKENS),
    ):
        if len(items) > limit:
            raise ValueError(f"{name}: {len(items)} values; at most {limit} are accepted")
    if token_items:
        try:
            data["completion_token_ids"] = [int(item) for item in token_items]
        except ValueError:
            raise ValueError("expected tokens must be integers, comma-separated") from None
    if logprob_items:
        try:
            data["logprobs"] = [float(item) for item in logprob_items]
        except ValueError:
            raise ValueError("reference logprobs must be numbers, comma-separated") from None
    if tolerance is not None and tolerance != "":
        try:
            data["logprob_tolerance"] = float(tolerance)
        except (TypeError, ValueError):
            raise ValueError("logprob tolerance must be a number") from None
    if not data:
        return None
    return Fingerprint.from_dict(data).to_dict()
