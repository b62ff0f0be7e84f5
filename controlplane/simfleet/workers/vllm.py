"""The vLLM Python worker's admin routes (contract §4), with the real preconditions.

Bare route names, `{"status":"ok"}` replies, errors as HTTP-200 `status: error` bodies. Pause
keeps the worker registered (the router keeps sending requests, which queue until resume).
"""

from __future__ import annotations

from typing import Any

from controlplane.simfleet.config import FAMILY_VLLM
from controlplane.simfleet.workers.base import (
    NO_BROADCAST,
    Handler,
    JsonObject,
    Reply,
    SimWorker,
    handler_error,
    ok,
)

VLLM_RL_ROUTES = (
    "destroy_weights_update_group",
    "flush_cache",
    "get_weight_version",
    "init_weights_update_group",
    "liveness_probe",
    "pause_generation",
    "resume_generation",
    "set_weight_version",
    "abort_request",
    "update_weights_from_disk",
    "update_weights_from_distributed",
    "update_weights_from_tensor",
)
PAUSE_MODES = ("keep", "wait", "abort")
NOT_PAUSED = (
    "Worker must be paused via pause_generation() before updating weights. "
    "Call pause_generation() first, then update, then resume_generation()."
)


def _error(message: str, **extra: Any) -> Reply:
    return ok({"status": "error", **extra, "message": message})


class VllmWorker(SimWorker):
    """`dynamo.vllm` Python worker with `--enable-rl`."""

    family = FAMILY_VLLM
    advertised_routes = tuple(sorted(VLLM_RL_ROUTES))

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Python workers hard-code the endpoint name and ignore `DYN_RL_ENDPOINT`.
        self.endpoint = "rl"
        self.group_initialized = False
        self.loaded_path: str | None = None
        self.taints: list[str] = []
        #: LoRA adapters: name → (lora_id, source uri).
        self.loras: dict[str, tuple[int, str]] = {}
        self._next_lora_id = 1

    def build_routes(self) -> dict[str, Handler]:
        locked = {
            "pause_generation": self.pause_generation,
            "resume_generation": self.resume_generation,
            "flush_cache": self.flush_cache,
            "update_weights_from_disk": self.update_weights_from_disk,
            "update_weights_from_distributed": self.update_weights_from_distributed,
            "init_weights_update_group": self.init_weights_update_group,
            "destroy_weights_update_group": self.destroy_weights_update_group,
        }
        plain = {
            "liveness_probe": self.liveness_probe,
            "abort_request": self.abort_request,
            "get_weight_version": self.get_weight_version,
            "update_weights_from_tensor": self.update_weights_from_tensor,
            # Registered on the system server but not advertised in the `rl` descriptor.
            "control/sleep": self.sleep,
            "control/wake_up": self.wake_up,
            "control/start_profile": self.profile("Profiling started"),
            "control/stop_profile": self.profile("Profiling stopped"),
        }
        if self.spec.version_tracking:
            plain["set_weight_version"] = self.set_weight_version_route
        if self.spec.lora_capacity is not None:
            # Registered (and advertised) only with `--enable-lora`.
            plain["load_lora"] = self.load_lora
            plain["unload_lora"] = self.unload_lora
        routes = {name: self._object_body(self._serialized(h)) for name, h in locked.items()}
        routes.update({name: self._object_body(h) for name, h in plain.items()})
        # `update/model_taints` is wrapped by the Rust layer, not the Python body rules.
        routes["update/model_taints"] = self.model_taints
        return routes

    def descriptor(self) -> dict[str, Any] | None:
        body = super().descriptor()
        assert body is not None
        if self.spec.lora_capacity is not None:
            body["routes"] = sorted({*body["routes"], "load_lora", "unload_lora"})
        if not self.spec.version_tracking:
            body["routes"] = [r for r in body["routes"] if r != "set_weight_version"]
        return body

    def serving_adapters(self) -> dict[str, str]:
        return {name: uri for name, (_, uri) in self.loras.items()}

    # -- wrappers -------------------------------------------------------------------------------
    @staticmethod
    def _object_body(handler: Handler) -> Handler:
        async def wrapped(body: Any) -> Reply:
            if body is None:
                body = {}
            if not isinstance(body, dict):
                return _error("request body must be a JSON object")
            return await handler(body)

        return wrapped

    def _serialized(self, handler: Handler) -> Handler:
        async def wrapped(body: Any) -> Reply:
            async with self.lock:
                return await handler(body)

        return wrapped

    # -- routes ---------------------------------------------------------------------------------
    async def liveness_probe(self, body: JsonObject) -> Reply:
        return ok({"status": "ok", "alive": True})

    async def pause_generation(self, body: JsonObject) -> Reply:
        mode = body.get("mode", "keep")
        if mode not in PAUSE_MODES:
            return _error(f"Invalid mode '{mode}'; expected keep|wait|abort")
        clear_cache = bool(body.get("clear_cache", False))
        self.paused = True
        self.pause_mode = mode
        self.running.clear()
        if clear_cache:
            self.cache_resets += 1
        return ok(
            {"status": "ok", "message": "Engine paused", "mode": mode, "clear_cache": clear_cache}
        )

    async def resume_generation(self, body: JsonObject) -> Reply:
        self.paused = False
        self.pause_mode = None
        self.running.set()
        return ok({"status": "ok", "message": "Engine resumed"})

    async def flush_cache(self, body: JsonObject) -> Reply:
        self.flush_count += 1
        self.cache_resets += 1
        return ok({"status": "ok", "message": "Cache flushed"})

    async def abort_request(self, body: JsonObject) -> Reply:
        request_id = body.get("request_id")
        if not request_id:
            return _error("Missing 'request_id' in body")
        return ok({"status": "ok", "request_id": request_id})

    async def get_weight_version(self, body: JsonObject) -> Reply:
        if not self.spec.version_tracking:
            return ok({"status": "ok", "version": self.version})
        return ok(
            {"status": "ok", "version": self.version, "version_declared": self.version_declared}
        )

    async def set_weight_version_route(self, body: JsonObject) -> Reply:
        if "weight_version" not in body:
            return _error("Missing 'weight_version' in body")
        self.set_version(body["weight_version"])
        return ok({"status": "ok", "version": body["weight_version"]})

    def _apply_update(self, body: JsonObject, *, reset_cache: bool) -> Reply:
        declared = "weight_version" in body
        self.update_count += 1
        if reset_cache:
            self.cache_resets += 1
        if declared:
            self.set_version(body["weight_version"])
        version = body["weight_version"] if declared else "unknown"
        return ok({"status": "ok", "version": version, "version_declared": declared})

    async def update_weights_from_disk(self, body: JsonObject) -> Reply:
        # The paused check comes before argument validation, as in the real handler.
        if not self.paused:
            return _error(NOT_PAUSED)
        if "model_path" not in body:
            return _error("Missing 'model_path' in body")
        self.loaded_path = body["model_path"]
        return self._apply_update(body, reset_cache=True)

    async def update_weights_from_distributed(self, body: JsonObject) -> Reply:
        allow_unpaused = body.get("allow_unpaused", False)
        reset_cache = body.get("reset_prefix_cache", True)
        if not isinstance(allow_unpaused, bool):
            return _error("'allow_unpaused' must be a boolean")
        if not isinstance(reset_cache, bool):
            return _error("'reset_prefix_cache' must be a boolean")
        if allow_unpaused and reset_cache:
            return _error(
                "Unpaused weight updates cannot reset the prefix cache. Set "
                "'reset_prefix_cache' to false or pause generation first."
            )
        if not self.paused and not allow_unpaused:
            return _error(NOT_PAUSED)
        if not self.group_initialized:
            # Simulation choice: the engine RPC fails like a broadcaster that was never set up.
            return _error("weight update group is not initialized")
        if self.received_broadcast() is NO_BROADCAST:
            # Simulation choice: applying before the trainer broadcast finds nothing to apply.
            return _error("no weights were broadcast to the weight update group")
        return self._apply_update(body, reset_cache=reset_cache)

    async def update_weights_from_tensor(self, body: JsonObject) -> Reply:
        return _error("update_weights_from_tensor is not implemented")

    async def init_weights_update_group(self, body: JsonObject) -> Reply:
        # The kwargs (less `engine_rpc`) go flat to the engine RPC (`init_broadcaster`), which
        # joins the collective and blocks until every rank has joined.
        kwargs = {k: v for k, v in body.items() if k != "engine_rpc"}
        self.leave_group()  # a new broadcaster replaces the old one
        problem = await self.join_group(kwargs)
        if problem == "watchdog":
            # DYN_RL_INIT_WEIGHTS_TIMEOUT_S expired: the RPC is cancelled and the process exits.
            self.fleet.crash(self)
            return Reply(500, None)  # never sent: the connection drops
        if problem is not None:
            return _error(problem)
        self.group_initialized = True
        return ok({"status": "ok", "message": "Weight update group initialized"})

    async def destroy_weights_update_group(self, body: JsonObject) -> Reply:
        self.group_initialized = False
        self.leave_group()
        return ok({"status": "ok", "message": "Weight update group destroyed"})

    # -- LoRA (`--enable-lora`): replies say `status: success`, not `ok` -------------------------
    async def load_lora(self, body: JsonObject) -> Reply:
        name = body.get("lora_name")
        if not isinstance(name, str) or not name:
            return _error("'lora_name' is required and must be a string")
        source = body.get("source")
        if not source or not isinstance(source, dict):
            return _error("'source' object is required in request")
        uri = source.get("uri")
        if not isinstance(uri, str) or not uri:
            return _error("'source.uri' is required and must be a string")
        old = self.loras.get(name)
        if old is not None and not self.spec.lora_hotswap:
            return ok(
                {
                    "status": "success",
                    "message": f"LoRA adapter '{name}' already loaded",
                    "lora_name": name,
                    "lora_id": old[0],
                    "hot_swap": False,
                }
            )
        capacity = self.spec.lora_capacity or 0
        if old is None and len(self.loras) >= capacity:
            return _error(
                f"LoRA capacity exceeded: at most {capacity} adapter(s) may be loaded",
                lora_name=name,
            )
        hot_swap = old is not None
        lora_id = old[0] if old is not None else self._next_lora_id
        if old is None:
            self._next_lora_id += 1
        self.loras[name] = (lora_id, uri)
        verb = "hot-swapped" if hot_swap else "loaded"
        return ok(
            {
                "status": "success",
                "message": f"LoRA adapter '{name}' {verb} successfully",
                "lora_name": name,
                "lora_id": lora_id,
                "hot_swap": hot_swap,
            }
        )

    async def unload_lora(self, body: JsonObject) -> Reply:
        name = body.get("lora_name")
        if not isinstance(name, str) or not name:
            return _error("'lora_name' is required and must be a string")
        old = self.loras.pop(name, None)
        if old is None:
            return _error(f"LoRA adapter '{name}' not found. Available LoRAs: {list(self.loras)}")
        return ok(
            {
                "status": "success",
                "message": f"LoRA adapter '{name}' unloaded successfully",
                "lora_name": name,
                "lora_id": old[0],
            }
        )

    async def sleep(self, body: JsonObject) -> Reply:
        level = body.get("level", 1)
        if self.sleeping:
            return ok({"status": "ok", "message": "Engine already sleeping"})
        self.unregister()
        self.sleeping = True
        return ok({"status": "ok", "message": f"Engine slept (level={level})"})

    async def wake_up(self, body: JsonObject) -> Reply:
        if not self.sleeping:
            return ok({"status": "ok", "message": "Engine already awake"})
        self.sleeping = False
        self.register()
        return ok({"status": "ok", "message": "Engine woke"})

    @staticmethod
    def profile(message: str) -> Handler:
        async def handler(body: JsonObject) -> Reply:
            return ok({"status": "ok", "message": message})

        return handler

    async def model_taints(self, body: Any) -> Reply:
        taints = body.get("taints") if isinstance(body, dict) else None
        if not isinstance(taints, list) or not all(isinstance(t, str) for t in taints):
            return handler_error(
                "Python callback failed: ValueError: 'taints' must be a JSON array of strings"
            )
        self.taints = sorted(set(taints))
        return ok({"status": "ok", "taints": self.taints})
