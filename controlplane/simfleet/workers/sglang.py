"""The SGLang worker's admin routes (contract §6). Not discoverable through the RL listener.

Built-in `control/*` routes answer `{"success":..,"message":..}`; the default native routes
(`pause_generation`, `continue_generation`, memory occupation) answer `{"status":"ok"}` and
sync discovery with the paused state afterwards. Invalid bodies raise inside the handler, which
the system server reports as HTTP 500 `Handler error`.
"""

from __future__ import annotations

import re
from typing import Any

from controlplane.simfleet.config import FAMILY_SGLANG
from controlplane.simfleet.workers.base import (
    NO_BROADCAST,
    Handler,
    JsonObject,
    Reply,
    SimWorker,
    handler_error,
    ok,
)

DISK_FIELDS = frozenset(
    {
        "model_path",
        "load_format",
        "abort_all_requests",
        "weight_version",
        "is_async",
        "torch_empty_cache",
        "keep_pause",
        "recapture_cuda_graph",
        "token_step",
        "flush_cache",
    }
)
VERSION_FIELDS = frozenset({"new_version", "abort_all_requests"})
PAUSE_MODES = ("abort", "retract", "in_place")
#: SGLang's memory-occupation tags (`release_memory_occupation` / `resume_...`).
MEMORY_TAGS = ("weights", "kv_cache", "cuda_graph")
#: Configured routes that give the control plane every operation (`--engine-route ...`).
SGLANG_CONFIGURED_ROUTES = (
    "flush_cache",
    "get_weight_version",
    "init_weights_update_group",
    "destroy_weights_update_group",
)
_SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def _type_error(
    cls: str, body: JsonObject, allowed: frozenset[str], required: tuple[str, ...]
) -> Reply | None:
    """The TypeError a dataclass constructor raises, as the system server reports it."""
    for key in body:
        if key not in allowed:
            return handler_error(
                f"Python callback failed: TypeError: {cls}.__init__() got an unexpected "
                f"keyword argument '{key}'"
            )
    missing = [name for name in required if name not in body]
    if missing:
        return handler_error(
            f"Python callback failed: TypeError: {cls}.__init__() missing 1 required "
            f"positional argument: '{missing[0]}'"
        )
    return None


def _object_only(handler: Handler) -> Handler:
    async def wrapped(body: Any) -> Reply:
        if body is None:
            body = {}
        if not isinstance(body, dict):
            return handler_error(
                "Python callback failed: ValueError: request body must be an object"
            )
        return await handler(body)

    return wrapped


class SglangWorker(SimWorker):
    """`dynamo.sglang` worker; registered by URL because it has no `rl` endpoint."""

    family = FAMILY_SGLANG
    advertised_routes = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        #: Memory-occupation tags currently released.
        self.released: set[str] = set()
        super().__init__(*args, **kwargs)
        #: Requests held across a pause (`WorkerSpec.paused_requests`). A disk update reports
        #: them as `num_paused_requests`, as SGLang does, and drops them when
        #: `abort_all_requests` is true.
        self.paused_requests = self.spec.paused_requests

    def build_routes(self) -> dict[str, Handler]:
        routes = {
            "control/update_weights_from_disk": self.update_weights_from_disk,
            "control/update_weights_from_tensor": self.update_online("tensor"),
            "control/update_weights_from_distributed": self.update_online("distributed"),
            "control/update_weights_from_ipc": self.update_online("ipc"),
            "control/update_weight_version": self.update_weight_version,
            "control/start_profile": self.profile("Profiling started"),
            "control/stop_profile": self.profile("Profiling stopped"),
            "update/model_taints": self.model_taints,
            "pause_generation": self.synced(self.pause_generation),
            "continue_generation": self.synced(self.continue_generation),
            "release_memory_occupation": self.synced(self.release_memory),
            "resume_memory_occupation": self.synced(self.resume_memory),
        }
        for descriptor in self.spec.engine_routes:
            path, handler = self._configured(descriptor)
            routes[path] = handler
        return {name: _object_only(handler) for name, handler in routes.items()}

    def _configured(self, descriptor: str) -> tuple[str, Handler]:
        """Parse `path[=method][:engine|tm]` for the methods this simulator implements."""
        spec, _, _target = descriptor.partition(":")
        path, _, method = spec.partition("=")
        method = method or path
        if not all(_SEGMENT.fullmatch(seg) for seg in path.split("/")):
            raise ValueError(f"Invalid SGLang engine route descriptor {descriptor!r}")
        known: dict[str, Handler] = {
            "flush_cache": self.flush_cache,
            "get_weight_version": self.get_weight_version,
            "init_weights_update_group": self.init_weights_update_group,
            "destroy_weights_update_group": self.destroy_weights_update_group,
        }
        if method not in known:
            raise ValueError(f"simulated SGLang has no method {method!r}")
        return path, self.synced(known[method])

    def synced(self, handler: Handler) -> Handler:
        """Default/configured routes: after the call, discovery follows the paused state."""

        async def wrapped(body: JsonObject) -> Reply:
            async with self.lock:
                reply = await handler(body)
            if self.paused:
                self.unregister()
            else:
                self.register()
            return reply

        return wrapped

    def error_reply(self, message: str) -> Reply:
        return ok({"success": False, "message": message})

    # -- built-ins ------------------------------------------------------------------------------
    async def update_weights_from_disk(self, body: JsonObject) -> Reply:
        invalid = _type_error("UpdateWeightFromDiskReqInput", body, DISK_FIELDS, ("model_path",))
        if invalid:
            return invalid
        if "weights" in self.released:
            # Simulation choice: weights cannot be loaded into released memory.
            return ok(
                {
                    "success": False,
                    "message": "weights memory is released",
                    "num_paused_requests": 0,
                }
            )
        self.update_count += 1
        # SGLang's UpdateWeightFromDiskReqInput defaults flush_cache to True; false keeps the
        # old-weights prefix cache.
        if body.get("flush_cache", True):
            self.cache_resets += 1
        if body.get("weight_version") is not None:
            self.set_version(body["weight_version"])
        paused = self.paused_requests
        if body.get("abort_all_requests", False):
            self.paused_requests = 0
        if self.spec.dynamo_release == "1.7" and not body.get("keep_pause", False):
            # 1.7's SGLang continues generation after the update unless asked to stay paused
            # (the documented disk update sends keep_pause: true).
            self.paused = False
            self.register()
        return ok(
            {
                "success": True,
                "message": "Succeeded to update model weights.",
                "num_paused_requests": paused,
            }
        )

    def update_online(self, kind: str) -> Handler:
        async def handler(body: JsonObject) -> Reply:
            if kind == "distributed" and self.received_broadcast() is NO_BROADCAST:
                return ok({"success": False, "message": "no weights were broadcast to the group"})
            self.update_count += 1
            if body.get("weight_version") is not None:
                self.set_version(body["weight_version"])
            return ok(
                {"success": True, "message": f"Succeeded to update parameter online from {kind}."}
            )

        return handler

    async def update_weight_version(self, body: JsonObject) -> Reply:
        invalid = _type_error("UpdateWeightVersionReqInput", body, VERSION_FIELDS, ("new_version",))
        if invalid:
            return invalid
        version = body["new_version"]
        if body.get("abort_all_requests", False):
            self.paused_requests = 0  # every request in flight is aborted first
        self.set_version(version)
        return ok(
            {
                "success": True,
                "message": f"Weight version updated to {version}",
                "new_version": version,
            }
        )

    @staticmethod
    def profile(message: str) -> Handler:
        async def handler(body: JsonObject) -> Reply:
            return ok({"status": "ok", "message": message})

        return handler

    async def model_taints(self, body: JsonObject) -> Reply:
        taints = body.get("taints")
        if not isinstance(taints, list) or not all(isinstance(t, str) for t in taints):
            return handler_error(
                "Python callback failed: ValueError: 'taints' must be a JSON array of strings"
            )
        return ok({"status": "ok", "taints": sorted(set(taints))})

    # -- default native routes (tokenizer manager) ----------------------------------------------
    async def pause_generation(self, body: JsonObject) -> Reply:
        mode = body.get("mode", "abort")
        if mode not in PAUSE_MODES:
            return handler_error(f"Python callback failed: ValueError: Invalid mode: {mode}")
        self.paused = True
        self.pause_mode = mode
        self.running.clear()
        return ok({"status": "ok"})

    async def continue_generation(self, body: JsonObject) -> Reply:
        self.paused = False
        self.pause_mode = None
        self.running.set()
        return ok({"status": "ok"})

    async def release_memory(self, body: JsonObject) -> Reply:
        tags = self._tags(body)
        if isinstance(tags, Reply):
            return tags
        self.released |= tags
        self.sleeping = bool(self.released)
        if "kv_cache" in tags:
            self.cache_resets += 1  # the KV cache's memory is freed with what it held
        return ok({"status": "ok"})

    async def resume_memory(self, body: JsonObject) -> Reply:
        tags = self._tags(body)
        if isinstance(tags, Reply):
            return tags
        self.released -= tags
        self.sleeping = bool(self.released)
        return ok({"status": "ok"})

    @staticmethod
    def _tags(body: JsonObject) -> set[str] | Reply:
        """`tags` (None = all) as SGLang's memory-occupation request takes them."""
        tags = body.get("tags")
        if tags is None:
            return set(MEMORY_TAGS)
        if not isinstance(tags, list) or not set(tags) <= set(MEMORY_TAGS):
            return handler_error(f"Python callback failed: ValueError: invalid tags {tags!r}")
        return set(tags)

    def generation_problem(self) -> str | None:
        if self.released:
            return f"memory released ({', '.join(sorted(self.released))}); resume it first"
        return None

    def state(self) -> dict[str, Any]:
        return {
            **super().state(),
            "released": sorted(self.released),
            "paused_requests": self.paused_requests,
        }

    async def flush_cache(self, body: JsonObject) -> Reply:
        self.flush_count += 1
        self.cache_resets += 1
        return ok({"success": True})

    async def get_weight_version(self, body: JsonObject) -> Reply:
        # A plain string result is normalized to `{"result": ...}` by Dynamo.
        return ok({"result": self.version})

    # `(success, message)` tuples are normalized to `{"success", "message"}`.
    async def init_weights_update_group(self, body: JsonObject) -> Reply:
        self.leave_group()
        problem = await self.join_group(body)
        if problem is not None:
            reason = "not every rank joined in time" if problem == "watchdog" else problem
            return ok({"success": False, "message": f"Failed to init group: {reason}"})
        return ok({"success": True, "message": "Succeeded to initialize custom process group."})

    async def destroy_weights_update_group(self, body: JsonObject) -> Reply:
        self.leave_group()
        return ok({"success": True, "message": "Succeeded to destroy custom process group."})
