"""A simulated policy lineage: weight versions whose outputs drift the way RL checkpoints do.

Without a lineage a simulated worker's output is a hash of (version, prompt): any two versions
are unrelated, which is right for telling stale weights from fresh ones but gives a canary
judge nothing realistic to compare. With a lineage, a version names a *step* (`v12`, `step-12`
and `12` are all step 12) and its "weights" are a next-token distribution that is a smooth
function of the step:

- every context (the prompt and the tokens so far, folded into a rolling hash) has a small
  candidate set with base logits, both drawn from the lineage seed and the same for every
  version, so successors agree on what is plausible;
- each logit moves with the step as a sum of slow sinusoids with per-(context, candidate)
  phases: one step moves a logit by at most `amplitude * sum(FREQUENCIES)`, a hundred steps by
  up to about `2 * amplitude * len(FREQUENCIES)`; the greedy token changes only where two
  candidates were close, as in real policy updates.

Broken checkpoints are configured per version (`BrokenCheckpoint`): `drift` and `marginal`
add version-keyed noise to every logit (large, or between a close successor and `drift`),
`garbage` emits a short repeating cycle, `zero_length` ends at once, and `nan_logprobs` has
NaN logprobs, delivered the way Dynamo 1.6.1's vLLM worker delivers them (mode `vllm`): the
chosen-token logprobs are dropped (serde cannot read a NaN, so the frontend loses the whole
logprobs payload and the choice has no `logprobs`) and prompt logprobs are clamped to -1e30
(`_finite_logprob` in dynamo/vllm/handlers.py); mode `null` writes `null` instead, as an
engine path that passes non-finite values through would.

Generation and teacher forcing use one function (`distribution`), so the prompt logprob of a
token equals the generation logprob of the same token after the same prefix, exactly.
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Final, Literal, get_args

from controlplane.simfleet.tokens import (
    FIRST_EMITTED_ID,
    NEAR_TIE_LOGPROB,
    VOCAB_SIZE,
    jitter_offset,
)

BrokenKind = Literal["drift", "marginal", "garbage", "zero_length", "nan_logprobs"]
BROKEN_KINDS: tuple[str, ...] = get_args(BrokenKind)

#: Candidates per context: the tokens a healthy checkpoint gives real probability to.
CANDIDATES: Final = 8
#: Step frequencies of the drift (radians per step): slow enough that neighbours agree.
FREQUENCIES: Final = (0.021, 0.047, 0.089)
#: Per-logit drift amplitude of a healthy lineage. One step moves a logit by < 0.04.
DEFAULT_AMPLITUDE: Final = 0.25
#: Version-keyed noise added to every logit by the two drifting broken kinds.
DEFAULT_MAGNITUDE: Final = {"drift": 4.0, "marginal": 0.9}
#: `drift` also pushes the base model's favourite down by this much, so the greedy token
#: changes at nearly every position rather than only where the noise happens to win.
DRIFT_DEMOTION: Final = 6.0
#: `garbage` repeats a cycle this long, each token with this (overconfident) logprob.
GARBAGE_CYCLE: Final = 3
GARBAGE_LOGPROB: Final = -0.003
_TAIL_SIZE = VOCAB_SIZE - FIRST_EMITTED_ID - CANDIDATES
_UNIFORM_LOGPROB = -math.log(VOCAB_SIZE - FIRST_EMITTED_ID)
#: What Dynamo's vLLM handler writes for a non-finite prompt logprob.
MIN_FINITE_LOGPROB: Final = -1e30
_STEP = re.compile(r"(\d+)$")


@dataclass
class BrokenCheckpoint:
    """How one version of the lineage is broken."""

    kind: BrokenKind
    #: drift / marginal: the noise added to every logit (defaults in DEFAULT_MAGNITUDE).
    magnitude: float | None = None
    #: nan_logprobs: "vllm" (what Dynamo 1.6.1's vLLM path makes of NaN) or "null".
    mode: Literal["vllm", "null"] = "vllm"

    def __post_init__(self) -> None:
        if self.kind not in BROKEN_KINDS:
            raise ValueError(
                f"unknown broken checkpoint kind {self.kind!r}; expected one of {BROKEN_KINDS}"
            )
        if self.mode not in ("vllm", "null"):
            raise ValueError("mode must be 'vllm' or 'null'")
        if self.magnitude is not None and (
            not isinstance(self.magnitude, int | float) or not 0 <= self.magnitude <= 50
        ):
            raise ValueError("magnitude must be a number in [0, 50]")

    @property
    def noise(self) -> float:
        if self.kind not in DEFAULT_MAGNITUDE:
            return 0.0
        return float(self.magnitude if self.magnitude is not None else DEFAULT_MAGNITUDE[self.kind])

    @classmethod
    def from_value(cls, value: str | dict[str, Any] | BrokenCheckpoint) -> BrokenCheckpoint:
        """`"drift"` or `{"kind": "marginal", "magnitude": 0.7}`; unknown keys are refused."""
        if isinstance(value, BrokenCheckpoint):
            return value
        if isinstance(value, str):
            return cls(kind=value)  # type: ignore[arg-type]
        if not isinstance(value, dict):
            raise ValueError("a broken checkpoint is a kind name or an object with 'kind'")
        unknown = set(value) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown broken checkpoint keys: {sorted(unknown)}")
        if "kind" not in value:
            raise ValueError("a broken checkpoint needs a 'kind'")
        return cls(**value)


@dataclass
class LineageConfig:
    """The lineage a simulated fleet serves (plain data, from Python, JSON or the CLI)."""

    seed: int = 0
    #: Per-logit drift amplitude of healthy steps (see the module docstring).
    amplitude: float = DEFAULT_AMPLITUDE
    #: Version (as a string: `"v7"`, `"7"`) to how it is broken.
    broken: dict[str, BrokenCheckpoint] = field(default_factory=dict)
    #: Explicit version → step, for versions without a trailing number.
    steps: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.broken, dict) or not isinstance(self.steps, dict):
            raise ValueError("lineage 'broken' and 'steps' are objects keyed by version")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError("lineage seed must be an integer")
        self.broken = {str(k): BrokenCheckpoint.from_value(v) for k, v in self.broken.items()}
        self.steps = {str(k): int(v) for k, v in self.steps.items()}
        if not isinstance(self.amplitude, int | float) or not 0 <= self.amplitude <= 10:
            raise ValueError("amplitude must be a number in [0, 10]")

    @classmethod
    def from_dict(cls, data: dict[str, Any] | LineageConfig) -> LineageConfig:
        if isinstance(data, LineageConfig):
            return data
        if not isinstance(data, dict):
            raise ValueError("a lineage is an object: seed, amplitude, broken, steps")
        unknown = set(data) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown lineage keys: {sorted(unknown)}")
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Distribution:
    """One context's next-token distribution under one version."""

    candidates: tuple[int, ...]
    #: Log-probabilities of the candidates, in candidate order.
    logprobs: tuple[float, ...]
    #: Log-probability of each token outside the candidates.
    tail_logprob: float

    def logprob(self, token: int) -> float:
        try:
            return self.logprobs[self.candidates.index(token)]
        except ValueError:
            return self.tail_logprob

    def rank(self, token: int) -> int:
        """vLLM's rank: 1 + how many tokens are strictly more likely."""
        value = self.logprob(token)
        return 1 + sum(1 for lp in self.logprobs if lp > value)

    def greedy(self) -> int:
        return self.candidates[max(range(len(self.logprobs)), key=self.logprobs.__getitem__)]

    def top(self, n: int) -> list[tuple[int, float]]:
        order = sorted(range(len(self.logprobs)), key=lambda i: -self.logprobs[i])
        return [(self.candidates[i], self.logprobs[i]) for i in order[:n]]


@dataclass(frozen=True, slots=True)
class Generation:
    """What a checkpoint generated: ids, chosen logprobs (None = NaN), and how it ended."""

    ids: list[int]
    logprobs: list[float | None]
    #: Top alternatives per position (token id, logprob), best first.
    top: list[list[tuple[int, float]]]
    detailed_finish_reason: str
    #: False when the reply carries no chosen-token logprobs (`nan_logprobs`, mode `vllm`).
    has_logprobs: bool = True


def step_of(version: Any, explicit: dict[str, int] | None = None) -> int | None:
    """The lineage step a version names, or None when it names none (not in the lineage)."""
    if explicit and str(version) in explicit:
        return explicit[str(version)]
    if isinstance(version, bool) or version is None:
        return None
    if isinstance(version, int):
        return version
    if isinstance(version, str):
        match = _STEP.search(version)
        return int(match.group(1)) if match else None
    return None


def _digest(*parts: bytes) -> bytes:
    h = hashlib.blake2b(digest_size=64)
    for part in parts:
        h.update(part)
    return h.digest()


def _units(digest: bytes) -> list[float]:
    """The digest as 32 numbers in [0, 1)."""
    return [int.from_bytes(digest[i : i + 2], "big") / 65536 for i in range(0, len(digest), 2)]


class Lineage:
    """The weights of every version of one lineage (pure functions of the config)."""

    def __init__(self, config: LineageConfig) -> None:
        self.config = config
        self._root = _digest(b"lineage", config.seed.to_bytes(8, "big", signed=True))[:16]

    # -- membership -----------------------------------------------------------------------------
    def step(self, version: Any) -> int | None:
        return step_of(version, self.config.steps)

    def covers(self, version: Any) -> bool:
        return self.step(version) is not None

    def broken(self, version: Any) -> BrokenCheckpoint | None:
        return self.config.broken.get(str(version))

    # -- the weights ----------------------------------------------------------------------------
    def start(self) -> bytes:
        return self._root

    @staticmethod
    def advance(state: bytes, token: int) -> bytes:
        """Fold one token into the context's rolling hash."""
        return hashlib.blake2b(state + token.to_bytes(4, "big"), digest_size=16).digest()

    def distribution(self, state: bytes, version: Any) -> Distribution:
        step = self.step(version)
        if step is None:
            raise ValueError(f"version {version!r} is not in the lineage")
        candidates, base, phases = _context(state)
        logits = list(base)
        amplitude = self.config.amplitude
        scale = amplitude / math.sqrt(len(FREQUENCIES))
        for j in range(CANDIDATES + 1):
            logits[j] += scale * sum(
                math.sin(w * step + 2 * math.pi * phases[3 * j + k])
                for k, w in enumerate(FREQUENCIES)
            )
        broken = self.broken(version)
        if broken is not None and broken.noise:
            noise = _units(_digest(b"broken", repr(version).encode(), state))
            for j in range(CANDIDATES + 1):
                logits[j] += broken.noise * (2 * noise[j] - 1)
            if broken.kind == "drift":
                logits[0] -= DRIFT_DEMOTION
        norm = _logsumexp(logits)
        lps = tuple(min(lp - norm, 0.0) for lp in logits[:CANDIDATES])
        tail = logits[CANDIDATES] - norm - math.log(_TAIL_SIZE)
        return Distribution(tuple(candidates), lps, tail)

    # -- what a worker serves -------------------------------------------------------------------
    def generate(
        self, version: Any, prompt: Sequence[int], max_tokens: int, top: int = 0
    ) -> Generation:
        """Greedy generation (temperature 0) under `version`, as its worker would answer."""
        broken = self.broken(version)
        if broken is not None and broken.kind == "zero_length":
            return Generation([], [], [], "eos")
        state = self.start()
        for token in prompt:
            state = self.advance(state, token)
        if broken is not None and broken.kind == "garbage":
            first = self.distribution(state, version).greedy()
            cycle = [first, *(FIRST_EMITTED_ID + (first + k) % 97 for k in range(1, GARBAGE_CYCLE))]
            looped = [cycle[i % GARBAGE_CYCLE] for i in range(max_tokens)]
            return Generation(
                looped,
                [GARBAGE_LOGPROB] * len(looped),
                [[(t, GARBAGE_LOGPROB)] if top else [] for t in looped],
                "length",
            )
        ids, values, alternatives = self._greedy(state, version, max_tokens, top)
        if broken is not None and broken.kind == "nan_logprobs":
            return Generation(
                ids,
                [None] * len(ids),
                [[] for _ in ids],
                "length",
                has_logprobs=broken.mode == "null",
            )
        return Generation(ids, values, alternatives, "length")

    def _greedy(
        self, state: bytes, version: Any, count: int, top: int, *, flip_from: int | None = None
    ) -> tuple[list[int], list[float | None], list[list[tuple[int, float]]]]:
        """`count` greedy tokens from `state`; with `flip_from`, the first near-tie at or
        after that position takes the runner-up instead (see `jittered`)."""
        ids: list[int] = []
        values: list[float | None] = []
        alternatives: list[list[tuple[int, float]]] = []
        for position in range(count):
            dist = self.distribution(state, version)
            token = dist.greedy()
            if flip_from is not None and position >= flip_from:
                best, runner_up = dist.top(2)
                if best[1] <= NEAR_TIE_LOGPROB:
                    token, flip_from = runner_up[0], None
            ids.append(token)
            values.append(dist.logprob(token))
            alternatives.append(dist.top(top) if top else [])
            state = self.advance(state, token)
        return ids, values, alternatives

    def jittered(
        self,
        version: Any,
        prompt: Sequence[int],
        max_tokens: int,
        *,
        magnitude: float,
        flip_from: int | None,
        seed: str,
        top: int = 0,
    ) -> Generation:
        """The same weights under other batching numerics (the `logprob_jitter` fault): every
        chosen logprob moves by at most `magnitude`; with `flip_from`, the first uncertain
        position at or after it (chosen probability at most one half) takes the runner-up
        and generation continues greedily from that prefix."""
        if self.broken(version) is not None:
            return self.generate(version, prompt, max_tokens, top)
        state = self.start()
        for token in prompt:
            state = self.advance(state, token)
        ids, values, alternatives = self._greedy(
            state, version, max_tokens, top, flip_from=flip_from
        )
        moved: list[float | None] = [
            None if v is None else min(v + jitter_offset(seed, i, magnitude), 0.0)
            for i, v in enumerate(values)
        ]
        return Generation(ids, moved, alternatives, "length")

    def prompt_logprobs(
        self, version: Any, prompt: Sequence[int], top: int = 0
    ) -> list[dict[int, tuple[float | None, int]] | None]:
        """Teacher forcing: each prompt token's (logprob, rank) given the tokens before it,
        plus the `top` most likely alternatives. Position 0 has none (`None`), as in vLLM."""
        broken = self.broken(version)
        # NaN weights: every value is the NaN as delivered (clamped, or null).
        nan = broken is not None and broken.kind == "nan_logprobs"
        nan_value = MIN_FINITE_LOGPROB if nan and broken and broken.mode == "vllm" else None
        garbage = broken is not None and broken.kind == "garbage"
        entries: list[dict[int, tuple[float | None, int]] | None] = [None] if prompt else []
        state = self.advance(self.start(), prompt[0]) if prompt else self.start()
        for token in prompt[1:]:
            if garbage:
                # A collapsed checkpoint: every token equally (un)likely.
                entries.append({token: (_UNIFORM_LOGPROB, 1)})
            else:
                dist = self.distribution(state, version)
                entry: dict[int, tuple[float | None, int]] = {
                    token: (nan_value if nan else dist.logprob(token), dist.rank(token))
                }
                for rank, (alt, lp) in enumerate(dist.top(top), start=1):
                    entry.setdefault(alt, (nan_value if nan else lp, rank))
                entries.append(entry)
            state = self.advance(state, token)
        return entries


@functools.lru_cache(maxsize=65536)
def _context(state: bytes) -> tuple[tuple[int, ...], tuple[float, ...], tuple[float, ...]]:
    """What every version of the lineage shares for one context: candidates, base logits
    (the last one pools the rest of the vocabulary) and drift phases. Cached: teacher forcing
    and generation of the same prefixes under two cohorts hit the same contexts."""
    structure = _units(_digest(b"structure", state))
    candidates: list[int] = []
    for i in range(CANDIDATES):
        token = FIRST_EMITTED_ID + int(structure[i] * 65536 * 17) % (VOCAB_SIZE - FIRST_EMITTED_ID)
        while token in candidates:
            token = FIRST_EMITTED_ID + (token + 1 - FIRST_EMITTED_ID) % (
                VOCAB_SIZE - FIRST_EMITTED_ID
            )
        candidates.append(token)
    # Base logits fall by random gaps: some contexts are confident, some near-ties.
    logits = [0.0]
    for i in range(1, CANDIDATES):
        logits.append(logits[-1] - (0.1 + 2.5 * structure[8 + i] ** 2))
    # The rest of the vocabulary as one pooled logit: its total mass, spread evenly.
    logits.append(logits[0] - 1.0 - 3.0 * structure[16])
    phases = _units(_digest(b"phases", state))
    return tuple(candidates), tuple(logits), tuple(phases)


def _logsumexp(values: Sequence[float]) -> float:
    peak = max(values)
    return peak + math.log(sum(math.exp(v - peak) for v in values))
