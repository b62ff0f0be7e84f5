"""The OpenAI-compatible frontend: `/v1/completions`, `/v1/models`, `/health`, `/live` and
`/metrics` (§3, §7).

Generation is deterministic (`generation.py`): a worker holding weight version V answers a
prompt from V's weights in the fleet's lineage, or else with `expected_completion_ids(V,
prompt, max_tokens)`. Each worker takes its own time to the first token and per token
(`latency.py`), in streaming and unary replies alike, and `/metrics` counts the traffic under
the real frontend's metric names (`metrics.py`). Routing follows discovery registration: a
paused sidecar (unregistered) is not routable, while a paused vLLM Python worker stays routable
and its requests wait until it resumes (bounded by `paused_generation_max_wait`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from typing import Any

from aiohttp import web

from controlplane.simfleet.config import FAMILY_SIDECAR
from controlplane.simfleet.fleet import SimFleet
from controlplane.simfleet.servers.common import (
    DropConnection,
    dumps,
    json_response,
    note_trace_headers,
    pause_for,
)
from controlplane.simfleet.servers.generation import GenerationFailed, Outcome, generate
from controlplane.simfleet.servers.metrics import FrontendMetrics
from controlplane.simfleet.servers.replies import Shape, StreamChunks, unary_body
from controlplane.simfleet.tokens import tokenize
from controlplane.simfleet.workers import SimWorker

DEFAULT_MAX_TOKENS = 16
MAX_TOKENS_LIMIT = 4096
ONE_CHOICE_ERROR = " ".join(
    (
        'Validation: `nvext.extra_fields=["completion_token_ids"]`',
        "requires exactly one generated choice",
    )
)
PIN_HEADER = "x-dynamo-worker-instance-id"
#: The model label the real frontend counts a request for an unknown model under.
UNKNOWN_MODEL = "unknown_model"
#: The `error_type` label of `dynamo_frontend_requests_total`, by HTTP status.
ERROR_TYPES = {400: "validation", 404: "not_found", 499: "cancelled", 501: "not_implemented"}


def oai_error(message: str, status: int, kind: str) -> web.Response:
    return json_response({"message": message, "type": kind, "code": status}, status)


class Frontend:
    """Serves the frontend port."""

    def __init__(self, fleet: SimFleet) -> None:
        self.fleet = fleet
        self._rotation = itertools.count()
        self.metrics = FrontendMetrics()

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        method, path = request.method, request.path
        note_trace_headers(self.fleet.received_headers, "frontend", request)
        if path == "/v1/completions" and method == "POST":
            return await self.completions(request)
        if path == "/metrics" and method == "GET":
            return web.Response(
                text=self.metrics.render(self.fleet.models()),
                content_type="text/plain",
                charset="utf-8",
                headers={"X-Content-Type-Options": "nosniff"},
            )
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
            # Refused before the handler runs: the real frontend counts nothing either.
            return oai_error(f"Failed to parse the request body as JSON: {exc}", 400, "Bad Request")
        if not isinstance(req, dict):
            return oai_error("request body must be a JSON object", 400, "Bad Request")
        model = req.get("model")
        label = model if isinstance(model, str) and self.fleet.serves(model) else UNKNOWN_MODEL
        request_type = "stream" if req.get("stream") else "unary"
        call = Call(self.metrics, label, request_type)
        try:
            return await self._complete(request, req, call)
        except GenerationFailed as failure:
            call.failed(failure.status)
            return failure.response()
        except DropConnection:
            call.failed(500)
            raise
        except (asyncio.CancelledError, ConnectionResetError):
            # The client went away (aiohttp cancels the handler, or a stream write finds the
            # socket closed): a cancelled request.
            self.metrics.disconnected()
            call.failed(499)
            raise
        except BaseException:
            call.failed(500)
            raise

    async def _complete(
        self, request: web.BaseRequest, req: dict[str, Any], call: Call
    ) -> web.StreamResponse:
        nvext = req["nvext"] if isinstance(req.get("nvext"), dict) else {}
        if "prompt_logprobs" in nvext:
            # It is a top-level field; 1.6.1's nvext refuses unknown keys (observed).
            raise GenerationFailed(
                400,
                "Failed to deserialize the JSON body into the target type: unknown field "
                "`prompt_logprobs`, expected one of `greed_sampling`, `use_raw_prompt`, "
                "`annotations`, `backend_instance_id`, `token_data`, `extra_fields`",
                "Bad Request",
            )
        extra = set(nvext.get("extra_fields") or [])
        prompts = self._prompts(req.get("prompt"))
        n = req.get("n") or 1
        if "completion_token_ids" in extra and (n != 1 or len(prompts) != 1):
            raise GenerationFailed(400, ONE_CHOICE_ERROR, "Bad Request")
        model = req.get("model")
        if not isinstance(model, str) or not self.fleet.serves(model):
            raise GenerationFailed(404, f"Model not found: {model}", "Not Found")
        worker = self._route(
            str(model), nvext.get("backend_instance_id", request.headers.get(PIN_HEADER))
        )
        sampling = req.get("sampling_params")
        if (
            worker.family == FAMILY_SIDECAR
            and worker.spec.dynamo_release == "1.7"
            and isinstance(sampling, dict)
            and "extra_args" in sampling
        ):
            # 1.7's vLLM sidecar refuses them (DYNAMO_CONTRACT §9.4).
            raise GenerationFailed(
                400, "sampling_params.extra_args is not supported", "Bad Request"
            )
        max_tokens = min(int(req.get("max_tokens") or DEFAULT_MAX_TOKENS), MAX_TOKENS_LIMIT)
        shape = Shape(req, extra)
        worker.generate_metrics.started()
        failed = True
        try:
            served = await self._serve(request, req, shape, worker, prompts[0], max_tokens, call)
            failed = False
            return served
        finally:
            worker.generate_metrics.finished(time.monotonic() - call.started_at, failed=failed)

    async def _serve(
        self,
        request: web.BaseRequest,
        req: dict[str, Any],
        shape: Shape,
        worker: SimWorker,
        prompt: list[int],
        max_tokens: int,
        call: Call,
    ) -> web.StreamResponse:
        """The routed worker runs the request: engine, latency, then the reply."""
        headers = (
            {"x-request-id": request.headers["x-request-id"]}
            if "x-request-id" in request.headers
            else {}
        )
        prompt_top = int(shape.prompt_logprobs) if shape.prompt_logprobs is not None else None
        outcome = await generate(
            self.fleet,
            worker,
            prompt,
            max_tokens,
            shape.model,
            top=shape.top,
            prompt_top=prompt_top,
        )
        # The engine's own time to its first token; an engine error surfaces after it.
        await pause_for(worker.latency.ttft(), self.fleet.stopping)
        if outcome.engine_error is not None:
            fault = outcome.engine_error
            raise GenerationFailed(fault.status, fault.message, "Internal Server Error")
        call.first_token(worker, len(prompt))
        if req.get("stream"):
            return await self._stream(request, shape, worker, prompt, outcome, headers, call)
        for _ in outcome.ids[1:]:
            await self._next_token(worker, call)
        call.succeeded(len(outcome.ids))
        body = unary_body(shape, worker, prompt, outcome)
        return web.Response(
            body=dumps(body), headers={"Content-Type": "application/json", **headers}
        )

    async def _next_token(self, worker: SimWorker, call: Call) -> None:
        gap = worker.latency.per_token()
        await pause_for(gap, self.fleet.stopping)
        call.next_token(worker, gap)

    @staticmethod
    def _prompts(prompt: Any) -> list[list[int]]:
        if isinstance(prompt, str):
            return [tokenize(prompt)]
        if isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
            return [list(p) for p in prompt]
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return [list(prompt)]
        raise GenerationFailed(400, "prompt must be a string or token ids", "Bad Request")

    def _route(self, model: str, pinned: Any) -> SimWorker:
        if pinned is not None:
            try:
                worker = self.fleet.by_instance.get(int(pinned))
            except (TypeError, ValueError):
                worker = None
            if worker is None or not worker.routable:
                raise GenerationFailed(400, "Invalid request", "Bad Request")
            if model != worker.model and model not in worker.serving_adapters():
                # A LoRA adapter is its own model: only a worker that loaded it serves it.
                raise GenerationFailed(404, f"Model not found: {model}", "Not Found")
            return worker
        candidates = self.fleet.routable(model)
        if not candidates:
            raise GenerationFailed(404, f"Model not found: {model}", "Not Found")
        return candidates[next(self._rotation) % len(candidates)]

    async def _stream(
        self,
        request: web.BaseRequest,
        shape: Shape,
        worker: SimWorker,
        prompt: list[int],
        outcome: Outcome,
        headers: dict[str, str],
        call: Call,
    ) -> web.StreamResponse:
        """SSE: one event per token carrying only its new id; the last one finishes."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", **headers})
        await response.prepare(request)
        chunks = StreamChunks(shape, worker, prompt, outcome)
        if not outcome.ids:
            await _event(response, chunks.empty_finish())
        for index in range(len(outcome.ids)):
            if index:
                await self._next_token(worker, call)
            await _event(response, chunks.token(index))
        closing = chunks.usage()
        if closing is not None:
            await _event(response, closing)
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        call.succeeded(len(outcome.ids))
        return response


async def _event(response: web.StreamResponse, chunk: dict[str, Any]) -> None:
    await response.write(b"data: " + dumps(chunk) + b"\n\n")


class Call:
    """One request's accounting in the frontend's metrics, recorded once whatever happens."""

    def __init__(self, metrics: FrontendMetrics, model: str, request_type: str) -> None:
        self.metrics = metrics
        self.model = model
        self.request_type = request_type
        self.started_at = time.monotonic()
        self.first_token_at: float | None = None
        self.done = False
        metrics.started(model, request_type)

    def first_token(self, worker: SimWorker, input_tokens: int) -> None:
        self.first_token_at = time.monotonic()
        self.metrics.first_token(
            self.model, worker.instance_id, self.first_token_at - self.started_at, input_tokens
        )

    def next_token(self, worker: SimWorker, seconds: float) -> None:
        self.metrics.next_token(self.model, worker.instance_id, seconds)

    def succeeded(self, output_tokens: int) -> None:
        self._finish(output_tokens=output_tokens, error_type="")

    def failed(self, status: int) -> None:
        self._finish(output_tokens=0, error_type=error_type_of(status))

    def _finish(self, *, output_tokens: int, error_type: str) -> None:
        if self.done:
            return
        self.done = True
        self.metrics.tokens(self.model, output_tokens)
        self.metrics.finished(
            self.model,
            self.request_type,
            seconds=time.monotonic() - self.started_at,
            output_tokens=output_tokens,
            error_type=error_type,
            queued=self.first_token_at is None,
        )


def error_type_of(status: int) -> str:
    """`dynamo_frontend_requests_total`'s `error_type` for an HTTP status (503 is the
    frontend's overload answer; anything else unexpected is internal)."""
    if status == 503:
        return "overload"
    return ERROR_TYPES.get(status, "internal")
