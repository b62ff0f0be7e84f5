"""The OpenAI-compatible frontend: `/v1/completions`, `/v1/models`, `/health`, `/live` (§3, §7).

Generation is deterministic: a worker holding weight version V answers a prompt with
`expected_completion_ids(V, prompt, max_tokens)`. Routing follows discovery registration: a
paused sidecar (unregistered) is not routable, while a paused vLLM Python worker stays routable
and its requests wait until it resumes (bounded by `paused_generation_max_wait`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import uuid
from typing import Any

from aiohttp import web

from controlplane.simfleet.config import FAMILY_SIDECAR
from controlplane.simfleet.faults import GENERATE, Fault
from controlplane.simfleet.fleet import SimFleet
from controlplane.simfleet.servers.common import (
    DropConnection,
    dumps,
    json_response,
    note_trace_headers,
    pause_for,
)
from controlplane.simfleet.tokens import (
    FIRST_EMITTED_ID,
    VOCAB_SIZE,
    completion_logprobs,
    expected_completion_ids,
    jittered_completion,
    token_logprob,
    token_text,
    tokenize,
    wrong_completion_ids,
)
from controlplane.simfleet.workers import SimWorker

#: What one generation produced: completion ids, detailed finish reason, chosen logprobs.
Generated = tuple[list[int], str, list[float]]

DEFAULT_MAX_TOKENS = 16
MAX_TOKENS_LIMIT = 4096
ONE_CHOICE_ERROR = " ".join(
    (
        'Validation: `nvext.extra_fields=["completion_token_ids"]`',
        "requires exactly one generated choice",
    )
)
PIN_HEADER = "x-dynamo-worker-instance-id"


def oai_error(message: str, status: int, kind: str) -> web.Response:
    return json_response({"message": message, "type": kind, "code": status}, status)


class GenerationFailed(Exception):
    """A request the engine could not complete; carries the HTTP error to return."""

    def __init__(self, response: web.Response) -> None:
        self.response = response


class Frontend:
    """Serves the frontend port."""

    def __init__(self, fleet: SimFleet) -> None:
        self.fleet = fleet
        self._rotation = itertools.count()

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        method, path = request.method, request.path
        note_trace_headers(self.fleet.received_headers, "frontend", request)
        if path == "/v1/completions" and method == "POST":
            try:
                return await self.completions(request)
            except GenerationFailed as failure:
                return failure.response
        if path == "/v1/models" and method == "GET":
            return json_response({"object": "list", "data": self._models()})
        if path == "/health" and method == "GET":
            return json_response(self._health())
        if path == "/live" and method == "GET":
            return json_response({"status": "live", "message": "Service is live"})
        return oai_error(f"Route not found: {method} {path}", 404, "Not Found")

    def _models(self) -> list[dict[str, Any]]:
        now = int(time.time())
        return [
            {"id": m, "object": "model", "created": now, "owned_by": "nvidia"}
            for m in self.fleet.models()
        ]

    def _health(self) -> dict[str, Any]:
        """Every registered endpoint instance of the cluster, as the 1.6.1 frontend lists them
        (observed: not scoped to any namespace; one entry per endpoint, so a vLLM worker shows
        its `generate` and its `rl` instance under one id; contract §3)."""
        instances = []
        for w in self.fleet.workers.values():
            endpoints = ["generate"] if w.routable else []
            if w.advertised_routes is not None and not w.dead:
                endpoints.append(w.endpoint)
            for endpoint in endpoints:
                instances.append(
                    {
                        "component": w.component,
                        "endpoint": endpoint,
                        "namespace": w.namespace,
                        "instance_id": w.instance_id,
                        "transport": {
                            "tcp": f"127.0.0.1:0/{w.token}/{w.namespace}/{w.component}/{endpoint}"
                        },
                        "device_type": "cuda",
                        "request_plane_codec": "msgpack",
                    }
                )
        names = {f"dyn://{i['namespace']}.{i['component']}.{i['endpoint']}" for i in instances}
        return {"status": "healthy", "endpoints": sorted(names), "instances": instances}

    # -- completions ----------------------------------------------------------------------------
    async def completions(self, request: web.BaseRequest) -> web.StreamResponse:
        try:
            req = json.loads(await request.read())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return oai_error(f"Failed to parse the request body as JSON: {exc}", 400, "Bad Request")
        if not isinstance(req, dict):
            return oai_error("request body must be a JSON object", 400, "Bad Request")
        nvext = req["nvext"] if isinstance(req.get("nvext"), dict) else {}
        extra = set(nvext.get("extra_fields") or [])
        prompts = self._prompts(req.get("prompt"))
        n = req.get("n") or 1
        if "completion_token_ids" in extra and (n != 1 or len(prompts) != 1):
            return oai_error(ONE_CHOICE_ERROR, 400, "Bad Request")
        model = req.get("model")
        if model not in self.fleet.models():
            return oai_error(f"Model not found: {model}", 404, "Not Found")
        worker = self._route(
            model, nvext.get("backend_instance_id", request.headers.get(PIN_HEADER))
        )
        sampling = req.get("sampling_params")
        if (
            worker.family == FAMILY_SIDECAR
            and worker.spec.dynamo_release == "1.7"
            and isinstance(sampling, dict)
            and "extra_args" in sampling
        ):
            # 1.7's vLLM sidecar refuses them (DYNAMO_CONTRACT §9.4).
            return oai_error("sampling_params.extra_args is not supported", 400, "Bad Request")
        max_tokens = min(int(req.get("max_tokens") or DEFAULT_MAX_TOKENS), MAX_TOKENS_LIMIT)
        headers = (
            {"x-request-id": request.headers["x-request-id"]}
            if "x-request-id" in request.headers
            else {}
        )
        result = await self._generate(worker, prompts[0], max_tokens, model)
        if req.get("stream"):
            return await self._stream(request, req, worker, prompts[0], result, extra, headers)
        body = self._unary_body(req, worker, prompts[0], result, extra)
        return web.Response(
            body=dumps(body), headers={"Content-Type": "application/json", **headers}
        )

    @staticmethod
    def _prompts(prompt: Any) -> list[list[int]]:
        if isinstance(prompt, str):
            return [tokenize(prompt)]
        if isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
            return [list(p) for p in prompt]
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return [list(prompt)]
        raise GenerationFailed(
            oai_error("prompt must be a string or token ids", 400, "Bad Request")
        )

    def _route(self, model: str, pinned: Any) -> SimWorker:
        if pinned is not None:
            try:
                worker = self.fleet.by_instance.get(int(pinned))
            except (TypeError, ValueError):
                worker = None
            if worker is None or not worker.routable:
                raise GenerationFailed(oai_error("Invalid request", 400, "Bad Request"))
            if model != worker.model and model not in worker.serving_adapters():
                # A LoRA adapter is its own model: only a worker that loaded it serves it.
                raise GenerationFailed(oai_error(f"Model not found: {model}", 404, "Not Found"))
            return worker
        candidates = self.fleet.routable(model)
        if not candidates:
            raise GenerationFailed(oai_error(f"Model not found: {model}", 404, "Not Found"))
        return candidates[next(self._rotation) % len(candidates)]

    async def _generate(
        self, worker: SimWorker, prompt: list[int], max_tokens: int, model: str | None = None
    ) -> Generated:
        """(ids, detailed_finish_reason, chosen logprobs) as the engine produced them, with
        generate faults."""
        cancelled = wrong = False
        jitter: Fault | None = None
        for fault in worker.faults.take(GENERATE, wildcard=False):
            if fault.kind in ("latency", "hang"):
                await pause_for(fault.seconds, self.fleet.stopping)
            elif fault.kind == "cancel":
                cancelled = True
            elif fault.kind == "wrong_tokens":
                wrong = True
            elif fault.kind == "logprob_jitter":
                jitter = fault
            elif fault.kind in ("http_error", "error_body"):
                status = fault.status if fault.kind == "http_error" else 500
                raise GenerationFailed(oai_error(fault.message, status, "Internal Server Error"))
            elif fault.kind in ("drop", "crash"):
                if fault.kind == "crash":
                    self.fleet.crash(worker)
                raise DropConnection
        if not worker.running.is_set():
            # A paused vLLM Python worker keeps accepting requests; they queue until resume.
            try:
                await asyncio.wait_for(
                    worker.running.wait(), self.fleet.config.paused_generation_max_wait
                )
            except TimeoutError:
                raise GenerationFailed(
                    oai_error("worker stayed paused; request timed out", 503, "Service Unavailable")
                ) from None
        if worker.dead:
            raise DropConnection
        problem = worker.generation_problem()
        if problem:
            raise GenerationFailed(oai_error(problem, 503, "Service Unavailable"))
        worker.generation_count += 1
        version = worker.generation_version_for(model)
        if wrong:
            ids = wrong_completion_ids(version, prompt, max_tokens)
            logprobs = completion_logprobs(ids)
        elif jitter is not None:
            ids, logprobs = jittered_completion(
                version,
                prompt,
                max_tokens,
                magnitude=jitter.magnitude,
                flip_from=jitter.position,
                seed=f"{worker.instance_id}:{worker.generation_count}",
            )
        else:
            ids = expected_completion_ids(version, prompt, max_tokens)
            logprobs = completion_logprobs(ids)
        if cancelled:
            keep = max(0, max_tokens // 2)
            return ids[:keep], "cancelled", logprobs[:keep]
        return ids, "length", logprobs

    @staticmethod
    def _logprobs(ids: list[int], values: list[float], top: int) -> dict[str, Any]:
        return {
            "tokens": [token_text(i) for i in ids],
            "token_logprobs": values,
            "top_logprobs": (
                [{token_text(i): v} for i, v in zip(ids, values, strict=True)] if top > 0 else []
            ),
            "text_offset": [],
        }

    @staticmethod
    def _prompt_logprobs(prompt: list[int], top: int) -> list[dict[str, Any] | None]:
        """vLLM's shape: position 0 has no logprob (`None`); every other position scores the
        prompt's own token (keyed by its id as a string) plus up to `top` alternatives."""
        entries: list[dict[str, Any] | None] = [None]
        for token in prompt[1:]:
            entry = {str(token): {"logprob": token_logprob(token), "rank": 1}}
            for rank, alt in enumerate(range(1, top + 1), start=2):
                other = FIRST_EMITTED_ID + (token + alt) % (VOCAB_SIZE - FIRST_EMITTED_ID)
                entry.setdefault(str(other), {"logprob": token_logprob(other) - 1.0, "rank": rank})
            entries.append(entry)
        return entries

    @staticmethod
    def _nvext(
        extra: set[str], worker: SimWorker, prompt: list[int], ids: list[int], detailed: str
    ) -> dict[str, Any]:
        nvext: dict[str, Any] = {}
        if "completion_token_ids" in extra:
            nvext["completion_token_ids"] = ids
        if "prompt_token_ids" in extra:
            nvext["prompt_token_ids"] = prompt
        if "detailed_finish_reason" in extra:
            nvext["detailed_finish_reason"] = detailed
        if "worker_id" in extra:
            nvext["worker_id"] = {
                "prefill_worker_id": worker.instance_id,
                "decode_worker_id": worker.instance_id,
            }
        if "timing" in extra:
            nvext["timing"] = {"request_received_ms": int(time.time() * 1000)}
        return nvext

    def _unary_body(
        self,
        req: dict[str, Any],
        worker: SimWorker,
        prompt: list[int],
        result: Generated,
        extra: set[str],
    ) -> dict[str, Any]:
        ids, detailed, values = result
        # Cancellation maps to `stop`; only `detailed_finish_reason` tells it apart.
        finish = "length" if detailed == "length" else "stop"
        choice: dict[str, Any] = {"text": "".join(token_text(i) for i in ids), "index": 0}
        if req.get("logprobs") is not None:
            choice["logprobs"] = self._logprobs(ids, values, int(req["logprobs"]))
        choice["finish_reason"] = finish
        body: dict[str, Any] = {
            "id": f"cmpl-{uuid.uuid4()}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": req["model"],
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": len(ids),
                "total_tokens": len(prompt) + len(ids),
            },
        }
        nvext = self._nvext(extra, worker, prompt, ids, detailed)
        if "prompt_logprobs" in extra and req.get("prompt_logprobs") is not None:
            nvext["prompt_logprobs"] = self._prompt_logprobs(prompt, int(req["prompt_logprobs"]))
        if nvext:
            body["nvext"] = nvext
        return body

    async def _stream(
        self,
        request: web.BaseRequest,
        req: dict[str, Any],
        worker: SimWorker,
        prompt: list[int],
        result: Generated,
        extra: set[str],
        headers: dict[str, str],
    ) -> web.StreamResponse:
        """SSE: one chunk per token carrying only its new id; the final chunk finishes."""
        ids, detailed, values = result
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", **headers})
        await response.prepare(request)
        completion_id = f"cmpl-{uuid.uuid4()}"
        created = int(time.time())
        for index, token in enumerate(ids):
            last = index == len(ids) - 1
            choice: dict[str, Any] = {"text": token_text(token), "index": 0}
            if req.get("logprobs") is not None:
                choice["logprobs"] = self._logprobs([token], [values[index]], int(req["logprobs"]))
            choice["finish_reason"] = (
                ("length" if detailed == "length" else "stop") if last else None
            )
            chunk: dict[str, Any] = {
                "id": completion_id,
                "object": "text_completion",
                "created": created,
                "model": req["model"],
                "choices": [choice],
            }
            nvext = self._nvext(extra - {"prompt_token_ids"}, worker, prompt, [token], detailed)
            if not last:
                nvext.pop("detailed_finish_reason", None)
            elif "prompt_token_ids" in extra:
                nvext["prompt_token_ids"] = prompt
            if nvext:
                chunk["nvext"] = nvext
            await response.write(b"data: " + dumps(chunk) + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response
