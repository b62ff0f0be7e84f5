"""The shapes of `/v1/completions` replies, unary and streamed, as the 1.6.1 frontend sends them.

`nvext` sits at the top level of the reply (contract §7). Prompt logprobs are in
`nvext.prompt_logprobs` when the request set the top-level `prompt_logprobs` *and* listed
`"prompt_logprobs"` in `nvext.extra_fields`: one entry per prompt position, `null` first, then
a map keyed by token id as a string to `{"logprob", "rank"}` holding the prompt's own token and
up to k alternatives (vLLM's shape as Dynamo forwards it; `decoded_token` is optional and left
out, as in the capture from the real 1.6.1 frontend). In a stream they ride on the event that
finishes.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from controlplane.simfleet.servers.generation import GenerationFailed, Outcome, PromptEntry
from controlplane.simfleet.tokens import token_text
from controlplane.simfleet.workers import SimWorker


class Shape:
    """What the request asked to see, read once. Bad counts are the frontend's 400."""

    def __init__(self, req: dict[str, Any], extra: set[str]) -> None:
        self.model = str(req["model"])
        self.extra = extra
        self.logprobs = _count(req, "logprobs")
        requested = _count(req, "prompt_logprobs")
        self.prompt_logprobs = requested if "prompt_logprobs" in extra else None
        options = req.get("stream_options")
        self.include_usage = isinstance(options, dict) and bool(options.get("include_usage"))

    @property
    def top(self) -> int:
        return int(self.logprobs) if self.logprobs is not None else 0


def _count(req: dict[str, Any], name: str) -> int | None:
    value = req.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise GenerationFailed(
            400,
            "Failed to deserialize the JSON body into the target type: "
            f"{name}: invalid value: {json.dumps(value)}, expected a non-negative integer",
            "Bad Request",
        )
    return int(value)


def finish_reason(detailed: str) -> str:
    # EOS, stop strings and cancellation all map to `stop`; `detailed_finish_reason` tells.
    return "length" if detailed == "length" else "stop"


def logprobs_block(outcome: Outcome, start: int, end: int, top: int) -> dict[str, Any]:
    ids = outcome.ids[start:end]
    values = outcome.logprobs[start:end]
    tops: list[dict[str, float | None]] = []
    if top > 0:
        for i, value, alternatives in zip(ids, values, outcome.top[start:end], strict=False):
            entry: dict[str, float | None] = {token_text(t): lp for t, lp in alternatives}
            # The chosen token is always listed, as OpenAI's top_logprobs do.
            entry.setdefault(token_text(i), value)
            tops.append(entry)
    return {
        "tokens": [token_text(i) for i in ids],
        "token_logprobs": values,
        "top_logprobs": tops,
        "text_offset": [],
    }


def prompt_logprobs_json(entries: list[PromptEntry | None]) -> list[dict[str, Any] | None]:
    return [
        None
        if entry is None
        else {str(token): {"logprob": lp, "rank": rank} for token, (lp, rank) in entry.items()}
        for entry in entries
    ]


def nvext_fields(
    extra: set[str], worker: SimWorker, prompt: list[int], ids: list[int], detailed: str | None
) -> dict[str, Any]:
    nvext: dict[str, Any] = {}
    if "completion_token_ids" in extra:
        nvext["completion_token_ids"] = ids
    if "prompt_token_ids" in extra:
        nvext["prompt_token_ids"] = prompt
    if "detailed_finish_reason" in extra and detailed is not None:
        nvext["detailed_finish_reason"] = detailed
    if "worker_id" in extra:
        nvext["worker_id"] = {
            "prefill_worker_id": worker.instance_id,
            "decode_worker_id": worker.instance_id,
        }
    if "timing" in extra:
        nvext["timing"] = {"request_received_ms": int(time.time() * 1000)}
    return nvext


def usage(prompt: list[int], outcome: Outcome) -> dict[str, int]:
    return {
        "prompt_tokens": len(prompt),
        "completion_tokens": len(outcome.ids),
        "total_tokens": len(prompt) + len(outcome.ids),
    }


def unary_body(
    shape: Shape, worker: SimWorker, prompt: list[int], outcome: Outcome
) -> dict[str, Any]:
    choice: dict[str, Any] = {"text": "".join(token_text(i) for i in outcome.ids), "index": 0}
    if shape.logprobs is not None and outcome.has_logprobs:
        choice["logprobs"] = logprobs_block(outcome, 0, len(outcome.ids), shape.top)
    choice["finish_reason"] = finish_reason(outcome.detailed_finish_reason)
    body: dict[str, Any] = {
        "id": f"cmpl-{uuid.uuid4()}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": shape.model,
        "choices": [choice],
        "usage": usage(prompt, outcome),
    }
    nvext = nvext_fields(shape.extra, worker, prompt, outcome.ids, outcome.detailed_finish_reason)
    if shape.prompt_logprobs is not None and outcome.prompt_logprobs is not None:
        nvext["prompt_logprobs"] = prompt_logprobs_json(outcome.prompt_logprobs)
    if nvext:
        body["nvext"] = nvext
    return body


class StreamChunks:
    """The SSE events of one streamed reply: one per token, the last one finishing."""

    def __init__(
        self, shape: Shape, worker: SimWorker, prompt: list[int], outcome: Outcome
    ) -> None:
        self.shape, self.worker, self.prompt, self.outcome = shape, worker, prompt, outcome
        self.id = f"cmpl-{uuid.uuid4()}"
        self.created = int(time.time())

    def _envelope(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.shape.model,
            "choices": choices,
        }

    def token(self, index: int) -> dict[str, Any]:
        """The event for token `index`; the last one carries the finish."""
        outcome, shape = self.outcome, self.shape
        last = index == len(outcome.ids) - 1
        token = outcome.ids[index]
        choice: dict[str, Any] = {"text": token_text(token), "index": 0}
        if shape.logprobs is not None and outcome.has_logprobs:
            choice["logprobs"] = logprobs_block(outcome, index, index + 1, shape.top)
        choice["finish_reason"] = finish_reason(outcome.detailed_finish_reason) if last else None
        chunk = self._envelope([choice])
        detailed = outcome.detailed_finish_reason if last else None
        # Each event carries only its own new ids; the prompt's ids come once, at the end.
        extra = shape.extra - {"prompt_token_ids"}
        nvext = nvext_fields(extra, self.worker, self.prompt, [token], detailed)
        if last:
            nvext.update(self._closing_nvext())
        if nvext:
            chunk["nvext"] = nvext
        chunk["usage"] = None
        return chunk

    def empty_finish(self) -> dict[str, Any]:
        """A reply with no tokens still ends with one finishing event."""
        choice = {
            "text": "",
            "index": 0,
            "finish_reason": finish_reason(self.outcome.detailed_finish_reason),
        }
        chunk = self._envelope([choice])
        extra = self.shape.extra - {"prompt_token_ids"}
        nvext = nvext_fields(
            extra, self.worker, self.prompt, [], self.outcome.detailed_finish_reason
        )
        nvext.update(self._closing_nvext())
        if nvext:
            chunk["nvext"] = nvext
        chunk["usage"] = None
        return chunk

    def _closing_nvext(self) -> dict[str, Any]:
        nvext: dict[str, Any] = {}
        if "prompt_token_ids" in self.shape.extra:
            nvext["prompt_token_ids"] = self.prompt
        if self.shape.prompt_logprobs is not None and self.outcome.prompt_logprobs is not None:
            nvext["prompt_logprobs"] = prompt_logprobs_json(self.outcome.prompt_logprobs)
        return nvext

    def usage(self) -> dict[str, Any] | None:
        """The extra `choices: []` event with usage, when `stream_options.include_usage`."""
        if not self.shape.include_usage:
            return None
        chunk = self._envelope([])
        chunk["usage"] = usage(self.prompt, self.outcome)
        return chunk
