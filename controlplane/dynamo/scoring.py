"""One prompt through one pinned worker, as the canary analysis needs it (`Observation`).

Two requests to the frontend's `/v1/completions`, both pinned with `nvext.backend_instance_id`,
both at temperature 0 (docs/reference/dynamo-scoring.md has the captured 1.6.1 exchanges):

- **generation**, streamed so the time to the first token is measured on the wire: the greedy
  continuation's ids (`nvext.completion_token_ids`, one piece per event), the chosen tokens'
  log probabilities and the finish (`nvext.detailed_finish_reason` when given);
- **teacher forcing** (only with a reference continuation): the prompt is the prompt ids
  followed by the continuation ids, `max_tokens` 1, and top-level `prompt_logprobs`; the
  reply's `nvext.prompt_logprobs` has one entry per prompt position, so the continuation's
  log probabilities are the entries after the prompt. 1.6.1 returns them only when
  `nvext.extra_fields` names `prompt_logprobs`.

Replies are outside data: bounded in size, every field type-checked, and a wrong one becomes
the observation's `error` text. Nothing in a reply raises. A path that returns no prompt
logprobs gives `continuation_logprobs=None`, so the judge marks drift unavailable instead of
reading a value nobody measured.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .admin import decode_body
from .errors import CallTimeout, TransportError, one_line
from .families.base import body_message
from .http import MAX_RESPONSE_BYTES, DynamoClient
from .jsonsafe import UnsafeJSON, loads_bounded
from .observation import Observation
from .policy import OutboundPolicy

U64_MAX = 2**64 - 1
#: `prompt_logprobs: 0` asks only for the prompt's own token at each position: all teacher
#: forcing needs, and the smallest reply (vLLM adds k alternatives per position for k > 0).
PROMPT_LOGPROBS_K = 0
GENERATION_EXTRA_FIELDS = ("completion_token_ids", "detailed_finish_reason", "worker_id")
TEACHER_EXTRA_FIELDS = ("prompt_logprobs", "worker_id")
#: A streamed reply has one event per token plus the finish, usage and `[DONE]`; more than this
#: many events beyond `max_tokens` is a reply we do not understand.
EXTRA_EVENTS = 8
#: One token's event is a few hundred bytes; the final one may carry prompt logprobs.
MAX_EVENT_BYTES = 1024 * 1024
#: Bounds on what we send: a prompt set is uploaded by people (analysis templates).
MAX_PROMPT_TOKENS = 65536
MAX_GENERATED_TOKENS = 4096


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _token_ids(value: object, what: str) -> tuple[int, ...]:
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise ValueError(f"{what} must be a list of token ids")
    ids = tuple(value)
    if not all(_is_int(t) and 0 <= t <= 2**32 - 1 for t in ids):
        raise ValueError(f"{what} must hold non-negative 32-bit token ids")
    return ids


def instance_number(instance_id: int | str) -> int:
    """The pinned id as the JSON integer the frontend expects (a u64; text from our records)."""
    if isinstance(instance_id, str):
        if not instance_id.isascii() or not instance_id.isdigit():
            raise ValueError(f"instance id {instance_id!r} is not a decimal integer")
        instance_id = int(instance_id)
    if not _is_int(instance_id) or not 0 <= instance_id <= U64_MAX:
        raise ValueError("instance id must be an unsigned 64-bit integer")
    return instance_id


@dataclass(frozen=True, slots=True)
class ScoringRequest:
    """What one observation sends; validated once, bodies built from it."""

    model: str
    instance_id: int
    prompt_ids: tuple[int, ...]
    continuation_ids: tuple[int, ...] | None
    max_tokens: int

    @classmethod
    def build(
        cls,
        *,
        model: str,
        instance_id: int | str,
        prompt_ids: Sequence[int],
        continuation_ids: Sequence[int] | None,
        max_tokens: int,
    ) -> ScoringRequest:
        if not isinstance(model, str) or not model:
            raise ValueError("model must be a non-empty string")
        prompt = _token_ids(prompt_ids, "prompt_ids")
        if not prompt:
            raise ValueError("prompt_ids must not be empty")
        continuation = None
        if continuation_ids is not None:
            continuation = _token_ids(continuation_ids, "continuation_ids")
            if not continuation:
                raise ValueError("continuation_ids must not be empty (pass None for none)")
        total = len(prompt) + len(continuation or ())
        if total > MAX_PROMPT_TOKENS:
            raise ValueError(f"prompt and continuation exceed {MAX_PROMPT_TOKENS} tokens")
        if not _is_int(max_tokens) or not 1 <= max_tokens <= MAX_GENERATED_TOKENS:
            raise ValueError(f"max_tokens must be an integer in 1..{MAX_GENERATED_TOKENS}")
        return cls(model, instance_number(instance_id), prompt, continuation, max_tokens)

    def generation_body(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "prompt": list(self.prompt_ids),
            "max_tokens": self.max_tokens,
            "temperature": 0,
            "n": 1,
            "logprobs": 0,  # the chosen token's log probability, no alternatives
            "stream": True,  # the first event's arrival is the time to first token
            "nvext": {
                # A Python int is an exact JSON integer, even above 2^53.
                "backend_instance_id": self.instance_id,
                "extra_fields": list(GENERATION_EXTRA_FIELDS),
            },
        }

    def teacher_forcing_body(self) -> dict[str, Any]:
        if self.continuation_ids is None:
            raise ValueError("teacher forcing needs a reference continuation")
        return {
            "model": self.model,
            "prompt": [*self.prompt_ids, *self.continuation_ids],
            "max_tokens": 1,
            "temperature": 0,
            "n": 1,
            "stream": False,
            # Top level: 1.6.1 refuses `prompt_logprobs` inside nvext (unknown field, HTTP 400).
            "prompt_logprobs": PROMPT_LOGPROBS_K,
            "nvext": {
                "backend_instance_id": self.instance_id,
                "extra_fields": list(TEACHER_EXTRA_FIELDS),
            },
        }


# -- reading replies (pure) ---------------------------------------------------------------------


class ReplyProblem(Exception):
    """A reply we cannot use; `str()` is the one-line reason the observation carries."""


@dataclass
class Generated:
    """What a streamed generation reply said, accumulated event by event."""

    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float | None] = field(default_factory=list)
    finish_reason: str | None = None
    detailed_finish_reason: str | None = None
    answered_by: int | None = None
    #: Whether any event carried a logprobs object (none at all: the engine gave none).
    saw_logprobs: bool = False
    done: bool = False
    events: int = 0


def http_problem(status: int, body: Any, instance_id: int) -> str:
    message = body_message(body) or (one_line(body, 200) if body else "no body")
    if status == 400 and message == "Invalid request":
        # 1.6.1 says only this for a pinned id it cannot route to (the worker left, or its
        # model card was rejected) and for a token id outside the vocabulary.
        return (
            f"HTTP 400: Invalid request (backend_instance_id {instance_id} not routable, "
            f"or a token id outside the vocabulary)"
        )
    return one_line(f"HTTP {status}: {message}")


def _error_text(body: dict[str, Any]) -> str:
    """An error object's message: Dynamo's `{"message": ...}` or OpenAI's nested
    `{"error": {"message": ...}}`."""
    error = body.get("error")
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return one_line(error["message"], 300)
    return body_message(body) or one_line(repr(error), 200)


#: At or below this a log probability is a stand-in for a non-finite one: Dynamo 1.6.1's vLLM
#: worker clamps a NaN or -inf prompt logprob to -1e30 before serde sees it
#: (`_finite_logprob` in dynamo/vllm/handlers.py), so a broken checkpoint's NaN arrives so.
NON_FINITE_FLOOR = -1e29


def _logprob(value: object) -> float | None:
    """A log probability, or None where the engine gave none. serde_json writes a NaN as
    null, so null is also how a broken engine's NaN arrives; a clamped one (at or below
    `NON_FINITE_FLOOR`) counts as none too, never as a very unlikely token."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    ok = math.isfinite(number) and NON_FINITE_FLOOR < number <= 0
    return number if ok else None


def read_event(event: Any, into: Generated, max_tokens: int) -> None:
    """Fold one streamed `text_completion` chunk into `into`; raise ReplyProblem if wrong."""
    into.events += 1
    if into.events > max_tokens + EXTRA_EVENTS:
        raise ReplyProblem(f"more than {max_tokens + EXTRA_EVENTS} events in the stream")
    if not isinstance(event, dict):
        raise ReplyProblem("a stream event is not a JSON object")
    if "error" in event:
        raise ReplyProblem(f"stream error: {_error_text(event)}")
    choices = event.get("choices")
    if not isinstance(choices, list) or len(choices) > 1:
        raise ReplyProblem("a stream event lacks a single-choice `choices` list")
    nvext = event.get("nvext")
    if nvext is not None and not isinstance(nvext, dict):
        raise ReplyProblem("a stream event's nvext is not an object")
    nvext = nvext or {}
    if not choices:  # the usage event (stream_options.include_usage)
        return
    choice = choices[0]
    if not isinstance(choice, dict):
        raise ReplyProblem("a stream event's choice is not an object")
    ids = nvext.get("completion_token_ids", [])
    if not isinstance(ids, list) or not all(_is_int(t) and t >= 0 for t in ids):
        raise ReplyProblem("nvext.completion_token_ids is not a list of token ids")
    into.completion_ids.extend(ids)
    if len(into.completion_ids) > max_tokens:
        raise ReplyProblem(f"more than max_tokens={max_tokens} ids generated")
    logprobs = choice.get("logprobs")
    if isinstance(logprobs, dict) and isinstance(logprobs.get("token_logprobs"), list):
        values = logprobs["token_logprobs"]
        if len(values) != len(ids):
            raise ReplyProblem(f"{len(values)} logprobs for {len(ids)} ids in one event")
        into.saw_logprobs = True
        into.logprobs.extend(_logprob(v) for v in values)
    elif ids:
        into.logprobs.extend([None] * len(ids))
    finish = choice.get("finish_reason")
    if isinstance(finish, str):
        into.finish_reason = finish
    detailed = nvext.get("detailed_finish_reason")
    if isinstance(detailed, str):
        into.detailed_finish_reason = detailed
    worker = nvext.get("worker_id")
    if isinstance(worker, dict) and _is_int(worker.get("decode_worker_id")):
        into.answered_by = worker["decode_worker_id"]


class EventStream:
    """Server-sent events split out of a byte stream as it arrives.

    Fed from `DynamoClient.send(on_chunk=...)`; notes when the first token arrived. Bounded by
    the body cap the client enforces and by `read_event`'s event count.
    """

    def __init__(self, max_tokens: int, clock: Any = time.perf_counter) -> None:
        self.max_tokens = max_tokens
        self.clock = clock
        self.generated = Generated()
        self.first_token_at: float | None = None
        self.problem: str | None = None
        self._pending = b""

    def feed(self, chunk: bytes) -> None:
        if self.problem is not None:
            return
        # Normalized on the joined bytes, so a CRLF split across two chunks is still seen.
        self._pending = (self._pending + chunk).replace(b"\r\n", b"\n")
        *events, self._pending = self._pending.split(b"\n\n")
        if len(self._pending) > MAX_EVENT_BYTES:
            self.problem = f"a stream event is over {MAX_EVENT_BYTES} bytes"
            return
        for raw in events:
            try:
                self._event(raw)
            except ReplyProblem as exc:
                self.problem = one_line(str(exc))
                return

    def finish(self) -> None:
        """The body ended: a last event without its blank line still counts."""
        if self._pending.strip():
            self.feed(b"\n\n")

    def _event(self, raw: bytes) -> None:
        data = b"\n".join(
            line[5:].lstrip(b" ") for line in raw.split(b"\n") if line.startswith(b"data:")
        )
        if not data:
            return  # a comment or keep-alive
        if self.generated.done:
            raise ReplyProblem("data after [DONE]")
        if data.strip() == b"[DONE]":
            self.generated.done = True
            return
        try:
            event = loads_bounded(data, max_bytes=MAX_RESPONSE_BYTES)
        except UnsafeJSON as exc:
            raise ReplyProblem(f"a stream event is not JSON: {exc}") from None
        before = len(self.generated.completion_ids)
        read_event(event, self.generated, self.max_tokens)
        if self.first_token_at is None and len(self.generated.completion_ids) > before:
            self.first_token_at = self.clock()


def generation_problem(generated: Generated, request: ScoringRequest) -> str | None:
    """Why a complete stream cannot be read as the pinned worker's greedy reply, or None."""
    if not generated.done:
        return "the stream ended without [DONE]"
    if generated.finish_reason is None:
        return "the stream carried no finish_reason"
    if generated.answered_by is not None and generated.answered_by != request.instance_id:
        return f"pinned to {request.instance_id} but worker {generated.answered_by} generated"
    return None


def continuation_logprobs(
    body: Any, request: ScoringRequest
) -> tuple[tuple[float | None, ...] | None, str | None]:
    """(continuation log probabilities, problem) from a unary teacher-forcing reply.

    No `nvext.prompt_logprobs` at all is (None, None): the path does not return them, which
    is not an error of this worker. An entry without the forced token's value is a None in
    its place (the engine gave none there).
    """
    continuation = request.continuation_ids or ()
    if not isinstance(body, dict):
        return None, "teacher-forcing reply is not a JSON object"
    if "error" in body:
        return None, one_line(f"teacher-forcing reply carries an error: {_error_text(body)}")
    nvext = body.get("nvext")
    if nvext is not None and not isinstance(nvext, dict):
        return None, "teacher-forcing reply's nvext is not an object"
    entries = (nvext or {}).get("prompt_logprobs")
    if entries is None:
        return None, None
    prompt = [*request.prompt_ids, *continuation]
    if not isinstance(entries, list) or len(entries) != len(prompt):
        n = len(entries) if isinstance(entries, list) else "no list of"
        return None, f"nvext.prompt_logprobs has {n} entries for a {len(prompt)}-token prompt"
    worker = (nvext or {}).get("worker_id")
    answered_by = worker.get("decode_worker_id") if isinstance(worker, dict) else None
    if _is_int(answered_by) and answered_by != request.instance_id:
        return None, (
            f"teacher forcing pinned to {request.instance_id} but worker {answered_by} answered"
        )
    values: list[float | None] = []
    start = len(request.prompt_ids)
    for position, token in enumerate(continuation, start):
        entry = entries[position]
        if entry is None:
            values.append(None)
            continue
        if not isinstance(entry, dict):
            return None, f"nvext.prompt_logprobs[{position}] is not an object"
        # Keyed by token id as text; with k > 0 alternatives share the map, so the forced
        # token's own key is the value, never "the first key".
        info = entry.get(str(token))
        values.append(_logprob(info.get("logprob")) if isinstance(info, dict) else None)
    return tuple(values), None


# -- the requests -------------------------------------------------------------------------------


async def _generate(
    client: DynamoClient, url: str, request: ScoringRequest, timeout: float
) -> dict[str, Any]:
    stream = EventStream(request.max_tokens)
    started = time.perf_counter()
    reply = await client.send(
        "POST",
        url,
        json_body=request.generation_body(),
        timeout=timeout,
        limit=MAX_RESPONSE_BYTES,
        error_limit=64 * 1024,
        accept="text/event-stream",
        on_chunk=stream.feed,
    )
    ended = time.perf_counter()
    if reply.raw is None:
        raise ReplyProblem("generation reply too large")
    if reply.status != 200:
        raise ReplyProblem(http_problem(reply.status, decode_body(reply.raw), request.instance_id))
    stream.finish()
    generated = stream.generated
    problem = stream.problem or generation_problem(generated, request)
    if problem:
        raise ReplyProblem(problem)
    first = stream.first_token_at
    return {
        "ttft_ms": None if first is None else (first - started) * 1000,
        "total_ms": (ended - started) * 1000,
        "completion_ids": tuple(generated.completion_ids),
        "completion_logprobs": tuple(generated.logprobs) if generated.saw_logprobs else (),
        "finish_reason": generated.detailed_finish_reason or generated.finish_reason,
    }


async def _teacher_force(
    client: DynamoClient, url: str, request: ScoringRequest, timeout: float
) -> tuple[float | None, ...] | None:
    reply = await client.send(
        "POST",
        url,
        json_body=request.teacher_forcing_body(),
        timeout=timeout,
        limit=MAX_RESPONSE_BYTES,
        error_limit=64 * 1024,
    )
    if reply.raw is None:
        raise ReplyProblem("teacher-forcing reply too large")
    body = decode_body(reply.raw)
    if reply.status != 200:
        why = http_problem(reply.status, body, request.instance_id)
        raise ReplyProblem(f"teacher forcing: {why}")
    values, problem = continuation_logprobs(body, request)
    if problem:
        raise ReplyProblem(problem)
    return values


async def observe(
    client: DynamoClient,
    frontend_url: str,
    *,
    model: str,
    instance_id: int | str,
    prompt_index: int,
    prompt_ids: Sequence[int],
    continuation_ids: Sequence[int] | None,
    max_tokens: int,
    policy: OutboundPolicy,
    timeout: float,
) -> Observation:
    """One prompt through one pinned worker. Bad arguments raise ValueError before any call;
    everything the network or the frontend does ends up in the returned observation."""
    request = ScoringRequest.build(
        model=model,
        instance_id=instance_id,
        prompt_ids=prompt_ids,
        continuation_ids=continuation_ids,
        max_tokens=max_tokens,
    )
    key = str(request.instance_id)
    url = frontend_url.rstrip("/") + "/v1/completions"
    violation = await policy.aviolation(url)
    if violation is not None:
        return Observation(prompt_index, key, error=one_line(f"outbound policy: {violation}"))
    facts: dict[str, Any] = {}
    try:
        facts = await _generate(client, url, request, timeout)
        if request.continuation_ids is not None:
            facts["continuation_logprobs"] = await _teacher_force(client, url, request, timeout)
    except CallTimeout:
        return Observation(
            prompt_index, key, error=f"frontend timed out after {timeout:g}s", **facts
        )
    except TransportError as exc:
        return Observation(
            prompt_index, key, error=one_line(f"frontend unreachable: {exc.reason}"), **facts
        )
    except ReplyProblem as exc:
        return Observation(prompt_index, key, error=one_line(str(exc)), **facts)
    return Observation(prompt_index, key, **facts)


@dataclass(frozen=True, slots=True)
class CohortPrompt:
    """One prompt of a cohort run: its index in the template, ids and reference continuation."""

    index: int
    prompt_ids: tuple[int, ...]
    continuation_ids: tuple[int, ...] | None = None


async def observe_cohort(
    client: DynamoClient,
    frontend_url: str,
    *,
    model: str,
    instance_ids: Sequence[int | str],
    prompts: Sequence[CohortPrompt],
    max_tokens: int,
    policy: OutboundPolicy,
    timeout: float,
    concurrency: int = 8,
) -> list[Observation]:
    """Every prompt through a cohort, prompt i pinned to `instance_ids[i % n]`, at most
    `concurrency` prompts in flight; observations in the order of `prompts`.

    Round-robin by position keeps the assignment reproducible, so a rerun of the analysis
    asks the same worker the same prompt.
    """
    if not instance_ids:
        raise ValueError("a cohort needs at least one instance")
    if not _is_int(concurrency) or concurrency < 1:
        raise ValueError("concurrency must be a positive integer")
    for prompt in prompts:  # every argument checked before the first request goes out
        ScoringRequest.build(
            model=model,
            instance_id=instance_ids[0],
            prompt_ids=prompt.prompt_ids,
            continuation_ids=prompt.continuation_ids,
            max_tokens=max_tokens,
        )
    for iid in instance_ids:
        instance_number(iid)
    bound = asyncio.Semaphore(concurrency)

    async def one(position: int, prompt: CohortPrompt) -> Observation:
        async with bound:
            return await observe(
                client,
                frontend_url,
                model=model,
                instance_id=instance_ids[position % len(instance_ids)],
                prompt_index=prompt.index,
                prompt_ids=prompt.prompt_ids,
                continuation_ids=prompt.continuation_ids,
                max_tokens=max_tokens,
                policy=policy,
                timeout=timeout,
            )

    return list(await asyncio.gather(*(one(p, prompt) for p, prompt in enumerate(prompts))))


__all__ = [
    "CohortPrompt",
    "EventStream",
    "ScoringRequest",
    "continuation_logprobs",
    "observe",
    "observe_cohort",
]
