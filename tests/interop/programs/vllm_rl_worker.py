"""A scripted vLLM-Python-style RL worker on the real Dynamo 1.6.1 runtime (CPU only).

Run with .venv-dynamo's python. It mirrors dynamo.vllm's worker wiring (worker_factory.py and
handlers.py in the 1.6.1 wheel): one DistributedRuntime, the RL admin routes registered with
register_rl_routes on the system server, the `rl` request-plane endpoint answering the
listener's {"method": "routes"} probe from RLRouteRegistry.dispatch_stream, and optionally a
`generate` endpoint with a registered model card so the real frontend routes completions here.
The "engine" is a stand-in whose output tokens are a function of the declared weight version,
so a test can tell which policy a worker is serving.

Variants (flags): --probe-error makes the rl probe fail with a status-error body, and
--omit-route drops routes (e.g. update_weights_from_disk) from registration.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

from dynamo.common.rl.admin import RLRouteRegistry, register_rl_routes
from dynamo.runtime import DistributedRuntime

# Run as a script, so its own directory is on sys.path; the tests import the same module.
from synthetic_model import SYNTHETIC_LOGPROB, policy_tokens, write_model_dir

log = logging.getLogger("interop.worker")

_NOT_OBJECT = {"status": "error", "message": "request body must be a JSON object"}
_MUST_PAUSE = (
    "Worker must be paused via pause_generation() before updating weights. "
    "Call pause_generation() first, then update, then resume_generation()."
)
# Same reserved set as dynamo.vllm.handlers._DISTRIBUTED_WEIGHT_UPDATE_RESERVED_KEYS.
_DISTRIBUTED_RESERVED = {"allow_unpaused", "reset_prefix_cache", "weight_version", "engine_rpc"}
_UNDECLARED = object()


def _normalize(body: Any) -> dict | None:
    """vLLM handlers treat null as {} and refuse any other non-object body."""
    if body is None:
        return {}
    return body if isinstance(body, dict) else None


class ScriptedVllmWorker:
    """The vLLM §4 route semantics over a fake engine that records what it was asked to do."""

    def __init__(self, group_dir: Path | None = None, world_size: int = 1) -> None:
        #: Where the stand-in collective rendezvous happens (`INTEROP_GROUP_DIR`); None = the
        #: group "forms" at once, as before.
        self.group_dir = group_dir
        self.world_size = world_size
        self.ranks: list[int] = []
        self.paused = False
        self.weight_version: Any = _UNDECLARED
        self.loaded_path: str | None = None
        self.cache_flushes = 0
        self.group_initialized = False
        self.rpc_log: list[tuple[str, dict]] = []
        #: ("paused" | "resumed", wall-clock ns) at each change, so a test can tell from the
        #: workers' own records which of them were paused at the same time.
        self.pause_log: list[tuple[str, int]] = []
        self._pause_lock = asyncio.Lock()
        # Generation waits while paused, like vLLM's keep mode queues requests.
        self._running = asyncio.Event()
        self._running.set()

    # --- admin routes --------------------------------------------------------------------

    async def liveness_probe(self, body: Any) -> dict:
        if _normalize(body) is None:
            return _NOT_OBJECT
        return {"status": "ok", "alive": True}

    async def pause_generation(self, body: Any) -> dict:
        body = _normalize(body)
        if body is None:
            return _NOT_OBJECT
        mode = body.get("mode", "keep")
        clear_cache = bool(body.get("clear_cache", False))
        if mode not in ("keep", "wait", "abort"):
            message = f"Invalid mode '{mode}'; expected keep|wait|abort"
            return {"status": "error", "message": message}
        async with self._pause_lock:
            if not self.paused:
                self.pause_log.append(("paused", time.time_ns()))
            self.paused = True
            self._running.clear()
            if clear_cache:
                self.cache_flushes += 1
            return {
                "status": "ok",
                "message": "Engine paused",
                "mode": mode,
                "clear_cache": clear_cache,
            }

    async def resume_generation(self, body: Any) -> dict:
        if _normalize(body) is None:
            return _NOT_OBJECT
        async with self._pause_lock:
            if self.paused:
                self.pause_log.append(("resumed", time.time_ns()))
            self.paused = False
            self._running.set()
            return {"status": "ok", "message": "Engine resumed"}

    async def flush_cache(self, body: Any) -> dict:
        if _normalize(body) is None:
            return _NOT_OBJECT
        async with self._pause_lock:
            self.cache_flushes += 1
            return {"status": "ok", "message": "Cache flushed"}

    async def abort_request(self, body: Any) -> dict:
        body = _normalize(body)
        if body is None:
            return _NOT_OBJECT
        request_id = body.get("request_id")
        if not request_id:
            return {"status": "error", "message": "Missing 'request_id' in body"}
        return {"status": "ok", "request_id": request_id}

    async def get_weight_version(self, body: Any) -> dict:
        if _normalize(body) is None:
            return _NOT_OBJECT
        declared = self.weight_version is not _UNDECLARED
        return {
            "status": "ok",
            "version": self.weight_version if declared else None,
            "version_declared": declared,
        }

    async def set_weight_version(self, body: Any) -> dict:
        body = _normalize(body)
        if body is None:
            return _NOT_OBJECT
        if "weight_version" not in body:
            return {"status": "error", "message": "Missing 'weight_version' in body"}
        self.weight_version = body["weight_version"]
        return {"status": "ok", "version": self.weight_version}

    async def update_weights_from_disk(self, body: Any) -> dict:
        body = _normalize(body)
        if body is None:
            return _NOT_OBJECT
        async with self._pause_lock:
            # The paused check precedes the model_path check, as in vLLM.
            if not self.paused:
                return {"status": "error", "message": _MUST_PAUSE}
            path = body.get("model_path")
            if not path:
                return {"status": "error", "message": "Missing 'model_path' in body"}
            version = body.get("weight_version", "unknown")
            rpc = body.get("engine_rpc", "reload_weights")
            kwargs = {"weights_path": path} if rpc == "reload_weights" else {"weight_path": path}
            self.rpc_log.append((rpc, kwargs))
            self.loaded_path = path
            self.cache_flushes += 1  # vLLM resets the prefix cache after a reload
            if "weight_version" in body:
                self.weight_version = version
            return {
                "status": "ok",
                "version": version,
                "version_declared": "weight_version" in body,
            }

    async def update_weights_from_distributed(self, body: Any) -> dict:
        body = _normalize(body)
        if body is None:
            return _NOT_OBJECT
        allow_unpaused = body.get("allow_unpaused", False)
        reset_prefix_cache = body.get("reset_prefix_cache", True)
        if not isinstance(allow_unpaused, bool):
            return {"status": "error", "message": "'allow_unpaused' must be a boolean"}
        if not isinstance(reset_prefix_cache, bool):
            return {"status": "error", "message": "'reset_prefix_cache' must be a boolean"}
        if allow_unpaused and reset_prefix_cache:
            return {
                "status": "error",
                "message": (
                    "Unpaused weight updates cannot reset the prefix cache. "
                    "Set 'reset_prefix_cache' to false or pause generation first."
                ),
            }
        async with self._pause_lock:
            if not self.paused and not allow_unpaused:
                return {"status": "error", "message": _MUST_PAUSE}
            if self.group_dir is not None and not (self.group_dir / "broadcast").exists():
                # Receiving needs the trainer's broadcast, as with a real broadcaster.
                return {"status": "error", "message": "no weights were broadcast to the group"}
            version = body.get("weight_version", "unknown")
            rpc = body.get("engine_rpc", "update_weights_from_path")
            kwargs = {k: v for k, v in body.items() if k not in _DISTRIBUTED_RESERVED}
            self.rpc_log.append((rpc, kwargs))
            if reset_prefix_cache:
                self.cache_flushes += 1
            if "weight_version" in body:
                self.weight_version = version
            return {
                "status": "ok",
                "version": version,
                "version_declared": "weight_version" in body,
            }

    async def update_weights_from_tensor(self, body: Any) -> dict:
        if _normalize(body) is None:
            return _NOT_OBJECT
        return {"status": "error", "message": "update_weights_from_tensor is not implemented"}

    async def init_weights_update_group(self, body: Any) -> dict:
        body = _normalize(body)
        if body is None:
            return _NOT_OBJECT
        rpc = body.get("engine_rpc", "init_broadcaster")
        kwargs = {k: v for k, v in body.items() if k != "engine_rpc"}
        async with self._pause_lock:
            self.rpc_log.append((rpc, kwargs))
            if self.group_dir is not None:
                # Like vLLM: the RPC rendezvouses with every rank, under the init watchdog;
                # if it expires the process exits (dynamo.vllm.handlers._shutdown_worker).
                timeout_s = float(os.environ.get("DYN_RL_INIT_WEIGHTS_TIMEOUT_S", "30"))
                try:
                    await asyncio.wait_for(self._rendezvous(kwargs), timeout_s)
                except TimeoutError:
                    log.error("init_weights_update_group timed out; terminating the worker")
                    os._exit(1)
                except (KeyError, TypeError, ValueError) as exc:
                    return {"status": "error", "message": str(exc)}
            self.group_initialized = True
            return {"status": "ok", "message": "Weight update group initialized"}

    async def _rendezvous(self, kwargs: dict) -> None:
        """A file-based stand-in for the NCCL TCP-store rendezvous: this worker's ranks are
        files under the group directory; the group forms when ranks 0..world_size-1 exist
        (rank 0 is written by the test's trainer)."""
        assert self.group_dir is not None
        offset, world = int(kwargs["rank_offset"]), int(kwargs["world_size"])
        self.group_dir.mkdir(parents=True, exist_ok=True)
        self.ranks = list(range(offset, offset + self.world_size))
        for rank in self.ranks:
            (self.group_dir / f"rank-{rank}").write_text(str(os.getpid()))
        while not all((self.group_dir / f"rank-{r}").exists() for r in range(world)):
            await asyncio.sleep(0.05)

    async def destroy_weights_update_group(self, body: Any) -> dict:
        body = _normalize(body)
        if body is None:
            return _NOT_OBJECT
        rpc = body.get("engine_rpc", "destroy_broadcaster")
        async with self._pause_lock:
            self.rpc_log.append((rpc, {k: v for k, v in body.items() if k != "engine_rpc"}))
            if self.group_dir is not None:
                for rank in self.ranks:
                    (self.group_dir / f"rank-{rank}").unlink(missing_ok=True)
                self.ranks = []
            self.group_initialized = False
            return {"status": "ok", "message": "Weight update group destroyed"}

    def routes(self) -> dict:
        """The 12 routes dynamo.vllm registers (worker_factory.register_engine_routes)."""
        return {
            "liveness_probe": self.liveness_probe,
            "pause_generation": self.pause_generation,
            "resume_generation": self.resume_generation,
            "flush_cache": self.flush_cache,
            "abort_request": self.abort_request,
            "update_weights_from_disk": self.update_weights_from_disk,
            "update_weights_from_distributed": self.update_weights_from_distributed,
            "update_weights_from_tensor": self.update_weights_from_tensor,
            "init_weights_update_group": self.init_weights_update_group,
            "destroy_weights_update_group": self.destroy_weights_update_group,
            "get_weight_version": self.get_weight_version,
            "set_weight_version": self.set_weight_version,
        }

    # --- debugging aid (not a vLLM route) ------------------------------------------------

    async def interop_state(self, body: Any) -> dict:
        """Lets a test see the fake engine's side effects; registered but never advertised."""
        declared = self.weight_version is not _UNDECLARED
        return {
            "paused": self.paused,
            "version": self.weight_version if declared else None,
            "loaded_path": self.loaded_path,
            "cache_flushes": self.cache_flushes,
            "group_initialized": self.group_initialized,
            "rpc_log": [[name, kwargs] for name, kwargs in self.rpc_log],
            "pause_log": [[event, at] for event, at in self.pause_log],
        }

    # --- generation ----------------------------------------------------------------------

    async def generate(self, request: dict, context: Any = None):
        """Token-in/token-out generation, in the LLMEngineOutput chunk shape vLLM yields."""
        await self._running.wait()
        prompt = list(request.get("token_ids") or [])
        stop = request.get("stop_conditions") or {}
        max_tokens = int(stop.get("max_tokens") or 4)
        options = request.get("output_options") or {}
        want_logprobs = options.get("logprobs") is not None
        want_prompt_logprobs = options.get("prompt_logprobs") is not None
        declared = self.weight_version is not _UNDECLARED
        tokens = policy_tokens(self.weight_version if declared else None, prompt, max_tokens)
        for i, token in enumerate(tokens):
            chunk: dict[str, Any] = {"token_ids": [token], "index": 0}
            if want_logprobs:
                chunk["log_probs"] = [SYNTHETIC_LOGPROB]
            if i == len(tokens) - 1:
                chunk["finish_reason"] = "length"
                if want_prompt_logprobs:
                    # As dynamo.common.backend.logprobs hands vLLM's to the frontend: on the
                    # final chunk's engine_data, position 0 undefined (None), then per position
                    # the prompt's own token (id as a string) with its logprob and rank.
                    chunk["engine_data"] = {
                        "prompt_logprobs": [None]
                        + [{str(t): {"logprob": SYNTHETIC_LOGPROB, "rank": 1}} for t in prompt[1:]]
                    }
                chunk["completion_usage"] = {
                    "prompt_tokens": len(prompt),
                    "completion_tokens": len(tokens),
                    "total_tokens": len(prompt) + len(tokens),
                }
            yield chunk


async def _serve(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    runtime = DistributedRuntime(loop, "file", "tcp")
    group_dir = os.environ.get("INTEROP_GROUP_DIR")
    worker = ScriptedVllmWorker(Path(group_dir) if group_dir else None, args.world_size)

    routes = worker.routes()
    for name in args.omit_route:
        routes.pop(name, None)
    registry = RLRouteRegistry(runtime, world_size=args.world_size)
    register_rl_routes(runtime, registry, routes, enable_dispatch=True)
    runtime.register_engine_route("interop/state", worker.interop_state)

    prefix = f"{args.namespace}.{args.component}"
    rl_endpoint = runtime.endpoint(f"{prefix}.rl")

    async def rl_dispatch(request=None):
        if args.probe_error is not None:
            # A worker whose descriptor request fails: the listener must report an `error`.
            yield {"status": "error", "message": args.probe_error}
            return
        if args.probe_reply is not None:
            # A descriptor of the test's choosing, passed through by the listener as it is.
            yield json.loads(args.probe_reply)
            return
        async for response in registry.dispatch_stream(request):
            yield response

    tasks = [rl_endpoint.serve_endpoint(rl_dispatch)]

    if args.model_name:
        from dynamo.llm import ModelInput, ModelType, WorkerType, register_model

        model_dir = write_model_dir(Path(args.model_dir))
        generate_endpoint = runtime.endpoint(f"{prefix}.generate")
        await register_model(
            ModelInput.Tokens,
            ModelType.Completions,
            generate_endpoint,
            str(model_dir),
            args.model_name,
            worker_type=WorkerType.Aggregated,
        )
        tasks.append(generate_endpoint.serve_endpoint(worker.generate))

    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    # Print the ids once serving starts so the harness log shows which process is which.
    print(
        json.dumps(
            {
                "event": "serving",
                "endpoint": f"dyn://{prefix}.rl",
                "system_url": runtime.system_status_server_url(),
                "pid": os.getpid(),
            }
        ),
        flush=True,
    )
    serving = asyncio.gather(*tasks)
    stopper = asyncio.create_task(stop.wait())
    await asyncio.wait({serving, stopper}, return_when=asyncio.FIRST_COMPLETED)
    runtime.shutdown()
    if serving.done():
        serving.result()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--namespace", default=os.environ.get("DYN_NAMESPACE", "dynamo"))
    parser.add_argument("--component", default="backend")
    parser.add_argument("--world-size", type=int, default=1)
    parser.add_argument("--model-name", help="also serve generation under this model name")
    parser.add_argument("--model-dir", help="where to write the synthetic model files")
    parser.add_argument(
        "--probe-error",
        metavar="MESSAGE",
        help='answer the rl probe with {"status": "error", "message": MESSAGE}',
    )
    parser.add_argument("--omit-route", action="append", default=[], metavar="ROUTE")
    parser.add_argument(
        "--probe-reply", metavar="JSON", help="answer the rl probe with this descriptor"
    )
    args = parser.parse_args(argv)
    if args.model_name and not args.model_dir:
        parser.error("--model-name needs --model-dir")
    logging.basicConfig(level=logging.INFO)
    asyncio.run(_serve(args))


if __name__ == "__main__":
    main()
