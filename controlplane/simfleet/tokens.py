"""Deterministic generation: the token ids a worker emits for a prompt at a weight version.

Tests and the control plane's verification step compute the expected ids with
`expected_completion_ids`, so a worker that did not really move to the new version (or that
silently reverted) answers with visibly different ids.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from typing import Any

VOCAB_SIZE = 32000
#: Ids below this are reserved (BOS/EOS/PAD); the simulated engine never emits them, so a
#: completion always runs to `max_tokens` and finishes with `length`.
FIRST_EMITTED_ID = 16


def _seed(version: Any, prompt_token_ids: Sequence[int], salt: str) -> bytes:
    # JSON with sorted keys: the version may be any JSON value (vLLM stores it verbatim).
    return json.dumps(
        [version, list(prompt_token_ids), salt], sort_keys=True, separators=(",", ":")
    ).encode()


def expected_completion_ids(
    version: Any, prompt_token_ids: Sequence[int], max_tokens: int, *, salt: str = ""
) -> list[int]:
    """The ids a healthy simulated worker holding `version` emits for this prompt."""
    seed = _seed(version, prompt_token_ids, salt)
    out: list[int] = []
    block = 0
    while len(out) < max_tokens:
        digest = hashlib.sha256(seed + block.to_bytes(4, "big")).digest()
        for i in range(0, len(digest), 4):
            value = int.from_bytes(digest[i : i + 4], "big")
            out.append(FIRST_EMITTED_ID + value % (VOCAB_SIZE - FIRST_EMITTED_ID))
        block += 1
    return out[:max_tokens]


def wrong_completion_ids(
    version: Any, prompt_token_ids: Sequence[int], max_tokens: int
) -> list[int]:
    """Ids a corrupted worker emits: same length, guaranteed different from the expected ones."""
    good = expected_completion_ids(version, prompt_token_ids, max_tokens)
    bad = expected_completion_ids(version, prompt_token_ids, max_tokens, salt="corrupt")
    pairs = zip(good, bad, strict=True)
    return [b if b != g else FIRST_EMITTED_ID + (g + 1) % VOCAB_SIZE for g, b in pairs]


#: The chosen token of a near-tie has probability at most one half.
NEAR_TIE_LOGPROB = math.log(0.5)


def completion_logprobs(ids: Sequence[int]) -> list[float]:
    """The chosen tokens' log-probabilities of a healthy worker (numerically exact)."""
    return [token_logprob(i) for i in ids]


def jitter_offset(seed: str, position: int, magnitude: float) -> float:
    """A reproducible offset in [-magnitude, magnitude] for one position of one worker."""
    digest = hashlib.sha256(f"{seed}:{position}".encode()).digest()
    unit = int.from_bytes(digest[:8], "big") / 2**64  # [0, 1)
    return (2 * unit - 1) * magnitude


def jittered_completion(
    version: Any,
    prompt_token_ids: Sequence[int],
    max_tokens: int,
    *,
    magnitude: float,
    flip_from: int | None,
    seed: str,
) -> tuple[list[int], list[float]]:
    """What the same weights produce under different batching numerics.

    Every chosen logprob moves by at most `magnitude` (a different reduction order). With
    `flip_from`, the first *uncertain* position at or after it (chosen probability at most one
    half, where a runner-up can be that close) flips to the runner-up, whose logprob is within
    `magnitude` of the original's; the rest continues greedily from that different prefix.
    A confident position never flips: no jitter this small can overturn it.
    """
    ids = expected_completion_ids(version, prompt_token_ids, max_tokens)
    logprobs = [
        lp + jitter_offset(seed, i, magnitude) for i, lp in enumerate(completion_logprobs(ids))
    ]
    if flip_from is None:
        return ids, [min(lp, 0.0) for lp in logprobs]
    for pos in range(max(flip_from, 0), len(ids)):
        if token_logprob(ids[pos]) > NEAR_TIE_LOGPROB:
            continue
        runner_up = FIRST_EMITTED_ID + (ids[pos] + 1 - FIRST_EMITTED_ID) % (
            VOCAB_SIZE - FIRST_EMITTED_ID
        )
        prefix = [*ids[:pos], runner_up]
        rest = expected_completion_ids(
            version, [*prompt_token_ids, *prefix], max_tokens - len(prefix)
        )
        flipped_lp = token_logprob(ids[pos]) - abs(jitter_offset(seed, pos, magnitude))
        rest_lp = [
            token_logprob(t) + jitter_offset(seed, len(prefix) + i, magnitude)
            for i, t in enumerate(rest)
        ]
        new_ids = [*prefix, *rest]
        new_lp = [*logprobs[:pos], flipped_lp, *rest_lp]
        return new_ids, [min(lp, 0.0) for lp in new_lp]
    return ids, [min(lp, 0.0) for lp in logprobs]


def token_logprob(token_id: int) -> float:
    """A stable, plausible log-probability for a sampled token (always negative)."""
    return -round(0.01 + (token_id * 2654435761 % 1000) / 1000, 4)


def token_text(token_id: int) -> str:
    """Detokenized text of one id. Leading space so joined texts read as words."""
    return f" t{token_id}"


def tokenize(text: str) -> list[int]:
    """Toy tokenizer for string prompts: one id per character."""
    return [FIRST_EMITTED_ID + ord(ch) % (VOCAB_SIZE - FIRST_EMITTED_ID) for ch in text]
