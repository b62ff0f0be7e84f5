"""The engine side of a completion: what a worker generates for a prompt, with its faults.

A worker holding a version of the fleet's lineage generates from that version's weights
(`lineage.py`); any other version answers with `expected_completion_ids(version, prompt)`, an
unrelated hash per version. Generate faults (`faults.py`) act here: delays, cancellation,
corrupted ids, jittered numerics, HTTP and engine errors, dropped connections.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from controlplane.simfleet.faults import GENERATE, Fault
from controlplane.simfleet.fleet import SimFleet
from controlplane.simfleet.servers.common import DropConnection, json_response, pause_for
from controlplane.simfleet.tokens import (
    FIRST_EMITTED_ID,
    VOCAB_SIZE,
    completion_logprobs,
    expected_completion_ids,
    jittered_completion,
    token_logprob,
    wrong_completion_ids,
)
from controlplane.simfleet.workers import SimWorker

#: One prompt position's teacher-forced entry: token id → (logprob or None for NaN, rank).
PromptEntry = dict[int, tuple[float | None, int]]


class GenerationFailed(Exception):
    """A request the engine could not complete; carries the HTTP error to return."""

    def __init__(self, status: int, message: str, kind: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind

    def response(self) -> web.Response:
        return json_response(
            {"message": self.message, "type": self.kind, "code": self.status}, self.status
        )


@dataclass
class Outcome:
    """What one generation produced, before the frontend shapes it into a reply."""

    ids: list[int]
    detailed_finish_reason: str
    #: Chosen tokens' logprobs; None is NaN (serde writes it as `null`).
    logprobs: list[float | None]
    #: Per position, the most likely alternatives (token id, logprob), best first.
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    #: False: the engine returned no logprobs at all.
    has_logprobs: bool = True
    #: Teacher-forced prompt logprobs when requested (None: the engine returned none).
    prompt_logprobs: list[PromptEntry | None] | None = None
    #: An engine error armed on this worker: it fires after the first token's delay.
    engine_error: Fault | None = None


async def generate(
    fleet: SimFleet,
    worker: SimWorker,
    prompt: list[int],
    max_tokens: int,
    model: str | None,
    *,
    top: int = 0,
    prompt_top: int | None = None,
) -> Outcome:
    """Run the engine on `worker`: faults first, then the weights of the version it serves."""
    cancelled = wrong = False
    jitter: Fault | None = None
    engine_error: Fault | None = None
    for fault in worker.faults.take(GENERATE, wildcard=False):
        if fault.kind in ("latency", "hang"):
            await pause_for(fault.seconds, fleet.stopping)
        elif fault.kind == "cancel":
            cancelled = True
        elif fault.kind == "wrong_tokens":
            wrong = True
        elif fault.kind == "logprob_jitter":
            jitter = fault
        elif fault.kind == "engine_error":
            engine_error = fault
        elif fault.kind in ("http_error", "error_body"):
            status = fault.status if fault.kind == "http_error" else 500
            raise GenerationFailed(status, fault.message, "Internal Server Error")
        elif fault.kind in ("drop", "crash"):
            if fault.kind == "crash":
                fleet.crash(worker)
            raise DropConnection
    if not worker.running.is_set():
        # A paused vLLM Python worker keeps accepting requests; they queue until resume.
        try:
            await asyncio.wait_for(worker.running.wait(), fleet.config.paused_generation_max_wait)
        except TimeoutError:
            raise GenerationFailed(
                503, "worker stayed paused; request timed out", "Service Unavailable"
            ) from None
    if worker.dead:
        raise DropConnection
    problem = worker.generation_problem()
    if problem:
        raise GenerationFailed(503, problem, "Service Unavailable")
    worker.generation_count += 1
    version = worker.generation_version_for(model)
    lineage = fleet.lineage
    if lineage is not None and lineage.covers(version) and not wrong:
        made = (
            lineage.jittered(
                version,
                prompt,
                max_tokens,
                magnitude=jitter.magnitude,
                flip_from=jitter.position,
                seed=f"{worker.instance_id}:{worker.generation_count}",
                top=top,
            )
            if jitter is not None
            else lineage.generate(version, prompt, max_tokens, top)
        )
        outcome = Outcome(
            made.ids,
            made.detailed_finish_reason,
            made.logprobs,
            made.top,
            made.has_logprobs,
        )
        if prompt_top is not None:
            outcome.prompt_logprobs = lineage.prompt_logprobs(version, prompt, prompt_top)
    else:
        outcome = _unrelated(worker, version, prompt, max_tokens, wrong, jitter)
        if prompt_top is not None:
            outcome.prompt_logprobs = _unrelated_prompt_logprobs(prompt, prompt_top)
    outcome.engine_error = engine_error
    if cancelled:
        keep = max(0, max_tokens // 2)
        outcome.ids, outcome.logprobs = outcome.ids[:keep], outcome.logprobs[:keep]
        outcome.top = outcome.top[:keep]
        outcome.detailed_finish_reason = "cancelled"
    return outcome


def _unrelated(
    worker: SimWorker,
    version: Any,
    prompt: list[int],
    max_tokens: int,
    wrong: bool,
    jitter: Fault | None,
) -> Outcome:
    """A version outside any lineage: its ids are a hash of (version, prompt)."""
    if wrong:
        ids = wrong_completion_ids(version, prompt, max_tokens)
        values = completion_logprobs(ids)
    elif jitter is not None:
        ids, values = jittered_completion(
            version,
            prompt,
            max_tokens,
            magnitude=jitter.magnitude,
            flip_from=jitter.position,
            seed=f"{worker.instance_id}:{worker.generation_count}",
        )
    else:
        ids = expected_completion_ids(version, prompt, max_tokens)
        values = completion_logprobs(ids)
    top = [[(i, v)] for i, v in zip(ids, values, strict=True)]
    return Outcome(ids, "length", list(values), top)


def _unrelated_prompt_logprobs(prompt: list[int], top: int) -> list[PromptEntry | None]:
    """Teacher forcing outside a lineage: a token's logprob is `token_logprob(id)`, the same
    value generation reports for it, so the two agree for the same tokens."""
    entries: list[PromptEntry | None] = [None] if prompt else []
    for token in prompt[1:]:
        entry: PromptEntry = {token: (token_logprob(token), 1)}
        for rank, alt in enumerate(range(1, top + 1), start=2):
            other = FIRST_EMITTED_ID + (token + alt) % (VOCAB_SIZE - FIRST_EMITTED_ID)
            entry.setdefault(other, (token_logprob(other) - 1.0, rank))
        entries.append(entry)
    return entries
