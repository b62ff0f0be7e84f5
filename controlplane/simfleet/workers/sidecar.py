"""The native vLLM sidecar (`dynamo.vllm.sidecar`, Rust) admin routes (contract §5).

`control/*` and `update/*` dialect. Pause and sleep unregister the generate instance *before*
calling the engine and stay unregistered even if the call fails; only a successful resume or a
full wake-up re-registers it. Control validation errors are HTTP 200 `status: error`; update
validation errors are HTTP 500 `Handler error` with an `InvalidRequest: ` prefix.
"""

from __future__ import annotations

from typing import Any

from controlplane.simfleet.config import FAMILY_SIDECAR
from controlplane.simfleet.workers.base import (
    NO_BROADCAST,
    Handler,
    JsonObject,
    Reply,
    SimWorker,
    handler_error,
    ok,
)

SIDECAR_ROUTES = (
    "control/get_weight_version",
    "control/is_paused",
    "control/is_sleeping",
    "control/pause_generation",
    "control/resume_generation",
    "control/sleep",
    "control/wake_up",
    "update/finish_weight_update",
    "update/init_weight_transfer_engine",
    "update/model_taints",
    "update/start_weight_update",
    "update/update_weight_version",
    "update/update_weights",
)
MODES = ("abort", "wait", "keep")
#: vLLM's `NCCLInitInfo` fields, which `init_info` carries for the NCCL transfer engine.
NCCL_INIT_FIELDS = ("master_address", "master_port", "rank_offset", "world_size")
WAKE_TAGS = ("weights", "kv_cache", "scheduling")


def _control_error(message: str) -> Reply:
    return ok({"status": "error", "message": f"InvalidRequest: {message}"})


def _update_error(message: str) -> Reply:
    return handler_error(f"InvalidRequest: {message}")


def _engine_error(rpc: str, message: str) -> Reply:
    """A gRPC error from vLLM, as the sidecar surfaces it."""
    return _engine_error_code(rpc, message, "FailedPrecondition")


def _engine_error_code(rpc: str, message: str, code: str) -> Reply:
    return handler_error(f"InvalidRequest: {rpc}: {message} ({code})")


class SidecarWorker(SimWorker):
    """Native Rust vLLM sidecar with `--enable-rl` and weight transfer + sleep capabilities."""

    family = FAMILY_SIDECAR
    advertised_routes = SIDECAR_ROUTES

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The sidecar reports "" until a version is set; it never reports null.
        if self.version is None:
            self.version = ""
            self.previous_version = ""
        self.transfer_initialized = False
        self.update_in_progress = False
        self.asleep_tags: set[str] = set()
        self.taints: list[str] = []

    def build_routes(self) -> dict[str, Handler]:
        control = {
            "control/pause_generation": self.pause_generation,
            "control/resume_generation": self.resume_generation,
            "control/is_paused": self.is_paused,
            "control/is_sleeping": self.is_sleeping,
            "control/get_weight_version": self.get_weight_version,
            "control/sleep": self.sleep,
            "control/wake_up": self.wake_up,
        }
        update = {
            "update/init_weight_transfer_engine": self.init_weight_transfer_engine,
            "update/start_weight_update": self.start_weight_update,
            "update/update_weights": self.update_weights,
            "update/finish_weight_update": self.finish_weight_update,
            "update/update_weight_version": self.update_weight_version,
            "update/model_taints": self.model_taints,
        }
        routes = {n: self._object_body(h, "engine control") for n, h in control.items()}
        routes.update({n: self._object_body(h, "engine update") for n, h in update.items()})
        return routes

    def descriptor(self) -> dict[str, Any] | None:
        body = super().descriptor()
        assert body is not None
        if self.spec.admin_base_url is not None:
            body["admin_base_url"] = self.spec.admin_base_url
        return body

    def before_engine_call(self, route: str) -> None:
        # The lifecycle wrapper unregisters before calling the engine, so a pause that then
        # fails (or hangs) still leaves the worker out of routing.
        if route in ("control/pause_generation", "control/sleep"):
            self.unregister()

    def health(self) -> Reply:
        # The sidecar answers a bare status and stays ready while paused.
        return Reply(200, {"status": "ready"})

    @staticmethod
    def _object_body(handler: Handler, kind: str) -> Handler:
        async def wrapped(body: Any) -> Reply:
            if not isinstance(body, dict):
                return ok(
                    {"status": "error", "message": f"{kind} request body must be a JSON object"}
                )
            return await handler(body)

        return wrapped

    # -- control --------------------------------------------------------------------------------
    def _check_mode(self, body: JsonObject, route: str) -> str | Reply:
        mode = body.get("mode", "abort")
        if not isinstance(mode, str) or mode not in MODES:
            return _control_error(f"{route} mode must be abort, wait, or keep; got `{mode}`")
        clear_cache = body.get("clear_cache")
        if clear_cache is not None and not isinstance(clear_cache, bool):
            return _control_error("`clear_cache` must be a boolean")
        return mode

    async def pause_generation(self, body: JsonObject) -> Reply:
        async with self.lock:
            mode = self._check_mode(body, "pause_generation")
            if isinstance(mode, Reply):
                return mode
            # Unregister before the engine call; a failed pause leaves the worker unrouted.
            self.unregister()
            self.paused = True
            self.pause_mode = mode
            self.running.clear()
            return ok({"status": "paused"})

    async def resume_generation(self, body: JsonObject) -> Reply:
        async with self.lock:
            self.paused = False
            self.pause_mode = None
            if self.sleeping:
                return ok({"status": "resumed", "is_sleeping": True})
            self.running.set()
            self.register()
            return ok({"status": "resumed"})

    async def is_paused(self, body: JsonObject) -> Reply:
        return ok({"is_paused": self.paused})

    async def is_sleeping(self, body: JsonObject) -> Reply:
        return ok({"is_sleeping": self.sleeping})

    async def get_weight_version(self, body: JsonObject) -> Reply:
        return ok({"weight_version": self.version})

    async def sleep(self, body: JsonObject) -> Reply:
        async with self.lock:
            level = body.get("level")
            if level is not None and (isinstance(level, bool) or level not in (0, 1, 2)):
                return _control_error("`level` must be one of 0, 1, or 2")
            mode = self._check_mode(body, "sleep")
            if isinstance(mode, Reply):
                return mode
            self.unregister()
            self.sleeping = True
            self.asleep_tags = set(WAKE_TAGS)
            return ok({"status": "sleeping"})

    async def wake_up(self, body: JsonObject) -> Reply:
        async with self.lock:
            tags = body.get("tags")
            if tags is None:
                tags = list(WAKE_TAGS)
            for tag in tags:
                if tag not in WAKE_TAGS:
                    return _control_error(
                        f"wake_up tag must be weights, kv_cache, or scheduling; got `{tag}`"
                    )
            self.asleep_tags -= set(tags)
            if self.asleep_tags:
                return ok({"status": "partially_awake", "is_sleeping": True})
            self.sleeping = False
            if not self.paused:
                self.register()
                self.running.set()
            return ok({"status": "awake"})

    # -- update ---------------------------------------------------------------------------------
    async def init_weight_transfer_engine(self, body: JsonObject) -> Reply:
        info = body.get("init_info")
        if not isinstance(info, dict):
            return _update_error("missing `init_info` JSON object")
        # Simulation choice: vLLM's NCCL engine needs these fields (NCCLInitInfo); without
        # them its gRPC call fails, which the sidecar reports as an engine error.
        missing = [k for k in NCCL_INIT_FIELDS if k not in info]
        if missing:
            return handler_error(
                "InvalidRequest: InitWeightTransferEngine: init_info is missing "
                f"{', '.join(missing)} (InvalidArgument)"
            )
        self.leave_group()  # re-initialising replaces the transfer engine's group
        problem = await self.join_group(info)
        if problem == "watchdog":
            return _engine_error_code(
                "InitWeightTransferEngine", "not every rank joined in time", "DeadlineExceeded"
            )
        if problem is not None:
            return _engine_error_code("InitWeightTransferEngine", problem, "InvalidArgument")
        self.transfer_initialized = True
        return ok({"message": "Weight transfer initialized"})

    async def start_weight_update(self, body: JsonObject) -> Reply:
        # Simulation choice: the stand-in engine enforces init → start → update → finish.
        if not self.transfer_initialized:
            return _engine_error("StartWeightUpdate", "weight transfer engine is not initialized")
        self.update_in_progress = True
        return ok({"message": "Weight update started"})

    async def update_weights(self, body: JsonObject) -> Reply:
        if not isinstance(body.get("update_info"), dict):
            return _update_error("missing `update_info` JSON object")
        if not self.update_in_progress:
            return _engine_error("UpdateWeights", "no weight update in progress")
        if self.received_broadcast() is NO_BROADCAST:
            return _engine_error("UpdateWeights", "no weights were broadcast to the group")
        self.update_count += 1
        return ok({"message": "Weights updated"})

    async def finish_weight_update(self, body: JsonObject) -> Reply:
        version = body.get("weight_version")
        if version is not None and not isinstance(version, str):
            return _update_error("`weight_version` must be a string")
        if not self.update_in_progress:
            return _engine_error("FinishWeightUpdate", "no weight update in progress")
        self.update_in_progress = False
        self.cache_resets += 1
        if version is not None:
            self.set_version(version)
        return ok({"message": "Weight update finished"})

    async def update_weight_version(self, body: JsonObject) -> Reply:
        version = body.get("new_version")
        if not isinstance(version, str) or not version:
            return _update_error("missing non-empty `new_version` string")
        self.set_version(version)
        return ok({"success": True, "new_version": version})

    async def model_taints(self, body: JsonObject) -> Reply:
        taints = body.get("taints")
        if not isinstance(taints, list) or not all(isinstance(t, str) for t in taints):
            return handler_error("'taints' must be a JSON array of strings")
        self.taints = sorted(set(taints))
        return ok({"status": "ok", "taints": self.taints})
