"""One prompt sent through one cohort of a canary analysis: what the frontend answered.

A plain record with no Django, filled by the scoring client (`dynamo/scoring.py`) from the
frontend's replies and read by the analysis metrics (`analysis/metrics.py`). `None` means "not
observed" (the worker errored, or the path did not return that field), never zero: the judge
tells missing data from a measured value.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Observation:
    #: Position of the prompt in the template's prompt set.
    prompt_index: int
    #: The instance the request was pinned to (`nvext.backend_instance_id`), as text.
    instance_id: str
    #: Why the prompt has no reply (transport failure, HTTP error, malformed body); None when
    #: the frontend answered.
    error: str | None = None
    #: Time to the first generated token and to the end of the reply, milliseconds.
    ttft_ms: float | None = None
    total_ms: float | None = None
    #: The greedy (temperature 0) continuation the engine produced.
    completion_ids: tuple[int, ...] = ()
    #: The chosen token's log probability per generated token; None entries where the engine
    #: gave none; an empty tuple when the reply carried no logprobs at all.
    completion_logprobs: tuple[float | None, ...] = ()
    #: `nvext.detailed_finish_reason` when given, else the choice's `finish_reason`.
    finish_reason: str | None = None
    #: Teacher-forced log probabilities of the reference continuation's tokens, one per token,
    #: read from prompt logprobs; None when the path returned no prompt logprobs.
    continuation_logprobs: tuple[float | None, ...] | None = None
