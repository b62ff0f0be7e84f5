"""Native vLLM sidecar routes (contract §5): `control/...` and `update/...` dialect.

Replies differ from the Python worker: pause → `{"status":"paused"}`, resume →
`{"status":"resumed"}` (not ok while `is_sleeping: true`, the worker stays out of routing),
updates → `{"message": ...}`, version → `{"weight_version": ""}` ("" = never set).

Cache invalidation: the sidecar has **no flush route**. This adapter therefore always pauses with
`clear_cache: true` unless the caller explicitly asks otherwise, so the prefix cache is dropped
at pause time; with the default `wait` mode (as the Python worker's, see `families/vllm.py`)
requests in flight finish on the old weights before the engine pauses and nothing runs while
paused, so after the update no old-weights cache remains. FLUSH_CACHE is unsupported;
`update_invalidates_cache` reports True for the distributed update on that basis (and False
if the caller disabled clear_cache: the refresh planner must then treat the cache as stale).

Liveness is `GET {system_url}/health`, expecting 200 with `status: ready`. It is not a pause
signal (it stays ready while paused); use `control/is_paused` for that.
"""

from __future__ import annotations

from typing import Any

from ..releases import DEFAULT_RELEASE, ReleaseContract, contract
from .base import (
    AdminCall,
    AdminFamily,
    AdminOutcome,
    Operation,
    engine,
    fail,
    ok,
    reject_unknown,
    require,
)

PAUSE_MODES = ("abort", "wait", "keep")

WAKE_TAGS = ("weights", "kv_cache", "scheduling")


class VllmSidecarFamily(AdminFamily):
    name = "vllm-sidecar"
    invalidating = frozenset({Operation.UPDATE_FROM_DISTRIBUTED})
    pause_modes = PAUSE_MODES
    default_pause_mode = "wait"

    def __init__(self, release: ReleaseContract | None = None) -> None:
        self.release = release or contract(DEFAULT_RELEASE)
        table = {Operation(op): tuple(r) for op, r in self.release.rules.sidecar_routes.items()}
        self.routes = {
            # GET /health on the system server, not an engine route.
            Operation.LIVENESS: frozenset(),
            **{op: frozenset(r) for op, r in table.items()},
        }
        one = {op: r[0] for op, r in table.items() if len(r) == 1}
        self.PAUSE, self.RESUME = one[Operation.PAUSE], one[Operation.RESUME]
        self.GET_VERSION, self.SET_VERSION = (
            one[Operation.GET_WEIGHT_VERSION],
            one[Operation.SET_WEIGHT_VERSION],
        )
        self.INIT = one[Operation.INIT_WEIGHTS_GROUP]
        self.START, self.UPDATE, self.FINISH = table[Operation.UPDATE_FROM_DISTRIBUTED]
        self.IS_PAUSED, self.IS_SLEEPING = one[Operation.IS_PAUSED], one[Operation.IS_SLEEPING]
        self.SLEEP, self.WAKE_UP = one[Operation.SLEEP], one[Operation.WAKE_UP]
        self._state_routes = {self.IS_PAUSED: "is_paused", self.IS_SLEEPING: "is_sleeping"}

    def _build(self, op: Operation, params: dict[str, Any]) -> list[AdminCall]:
        if op == Operation.LIVENESS:
            reject_unknown(params, set())
            return [AdminCall(op, "GET", "health", None)]
        if op == Operation.PAUSE:
            reject_unknown(params, {"mode", "clear_cache"})
            body: dict[str, Any] = {}
            mode = params.get("mode")
            if mode is not None:
                if mode not in PAUSE_MODES:
                    raise ValueError(f"invalid pause mode {mode!r}; expected abort|wait|keep")
                body["mode"] = mode
            # No flush route exists: clearing at pause is how this family invalidates cache.
            clear = params.get("clear_cache")
            body["clear_cache"] = True if clear is None else bool(clear)
            return [AdminCall(op, "POST", engine(self.PAUSE), body)]
        if op == Operation.RESUME:
            reject_unknown(params, set())
            return [AdminCall(op, "POST", engine(self.RESUME), {})]
        if op in (Operation.IS_PAUSED, Operation.IS_SLEEPING):
            reject_unknown(params, set())
            route = self.IS_PAUSED if op == Operation.IS_PAUSED else self.IS_SLEEPING
            return [AdminCall(op, "POST", engine(route), {})]
        if op == Operation.SLEEP:
            reject_unknown(params, {"level", "mode"})
            body = {}
            if params.get("level") is not None:
                if params["level"] not in (0, 1, 2) or isinstance(params["level"], bool):
                    raise ValueError("sleep level must be 0, 1 or 2")
                body["level"] = params["level"]
            if params.get("mode") is not None:
                if params["mode"] not in PAUSE_MODES:
                    raise ValueError(f"invalid sleep mode {params['mode']!r}")
                body["mode"] = params["mode"]
            return [AdminCall(op, "POST", engine(self.SLEEP), body)]
        if op == Operation.WAKE_UP:
            reject_unknown(params, {"tags"})
            body = {}
            if params.get("tags") is not None:
                tags = params["tags"]
                if not isinstance(tags, list) or not set(tags) <= set(WAKE_TAGS):
                    raise ValueError(f"wake_up tags must be a subset of {', '.join(WAKE_TAGS)}")
                body["tags"] = list(tags)
            return [AdminCall(op, "POST", engine(self.WAKE_UP), body)]
        if op == Operation.GET_WEIGHT_VERSION:
            reject_unknown(params, set())
            return [AdminCall(op, "POST", engine(self.GET_VERSION), {})]
        if op == Operation.SET_WEIGHT_VERSION:
            reject_unknown(params, {"weight_version"})
            version = require(params, "weight_version")
            if not isinstance(version, str) or not version:
                raise ValueError("sidecar weight_version must be a non-empty string")
            return [AdminCall(op, "POST", engine(self.SET_VERSION), {"new_version": version})]
        if op == Operation.INIT_WEIGHTS_GROUP:
            reject_unknown(params, {"init_info"})
            init_info = require(params, "init_info")
            if not isinstance(init_info, dict):
                raise ValueError("init_info must be an object")
            return [AdminCall(op, "POST", engine(self.INIT), {"init_info": init_info})]
        if op == Operation.UPDATE_FROM_DISTRIBUTED:
            reject_unknown(params, {"update_infos", "update_info", "weight_version"})
            infos = params.get("update_infos")
            if infos is None and params.get("update_info") is not None:
                infos = [params["update_info"]]
            if not infos or not all(isinstance(i, dict) for i in infos):
                raise ValueError("update_infos must be a non-empty list of objects")
            finish: dict[str, Any] = {}
            if params.get("weight_version") is not None:
                if not isinstance(params["weight_version"], str):
                    raise ValueError("sidecar weight_version must be a string")
                finish["weight_version"] = params["weight_version"]
            return [
                AdminCall(op, "POST", engine(self.START), {}),
                *(AdminCall(op, "POST", engine(self.UPDATE), {"update_info": i}) for i in infos),
                AdminCall(op, "POST", engine(self.FINISH), finish),
            ]
        raise AssertionError(op)  # unreachable: required_routes() rejected it

    def _accept(self, call: AdminCall, body: Any) -> AdminOutcome:
        if not isinstance(body, dict):
            return fail(body, f"expected a JSON object from {call.path}")
        route = call.route
        if call.operation == Operation.LIVENESS:
            if body.get("status") != "ready":
                return fail(body, f"health status is {body.get('status')!r}, not 'ready'")
            return ok(body)
        if route == self.PAUSE:
            if body.get("status") != "paused":
                return fail(body, f"expected status 'paused', got {body.get('status')!r}")
            return ok(body)
        if route == self.RESUME:
            if body.get("status") != "resumed":
                return fail(body, f"expected status 'resumed', got {body.get('status')!r}")
            if body.get("is_sleeping") is True:
                return fail(body, "engine resumed but is still sleeping; it stays out of routing")
            return ok(body)
        if route in self._state_routes:
            # Read after resume, as the check that the engine really runs again (`/health`
            # stays ready while paused, so it cannot tell).
            key = self._state_routes[route]
            if not isinstance(body.get(key), bool):
                return fail(body, f"{route} reply lacks a boolean {key!r}")
            if body[key]:
                return fail(body, f"the engine reports {key}=true after resume")
            return ok(body, **{key: body[key]})
        if route == self.SLEEP:
            if body.get("status") != "sleeping":
                return fail(body, f"expected status 'sleeping', got {body.get('status')!r}")
            return ok(body)
        if route == self.WAKE_UP:
            if body.get("status") != "awake" or body.get("is_sleeping") is True:
                return fail(body, f"engine is not fully awake: status {body.get('status')!r}")
            return ok(body)
        if route == self.GET_VERSION:
            version = body.get("weight_version")
            if not isinstance(version, str):
                return fail(body, "get_weight_version reply lacks a string 'weight_version'")
            # "" means never set: report it like the Python worker's undeclared null.
            return ok(body, version=version or None, version_declared=version != "")
        if route == self.SET_VERSION:
            if body.get("success") is not True:
                return fail(body, "update_weight_version did not report success=true")
            return ok(body, version=body.get("new_version"))
        if route in (self.INIT, self.START, self.UPDATE, self.FINISH):
            if not isinstance(body.get("message"), str):
                return fail(body, f"{route} reply lacks its 'message'")
            return ok(body)
        return fail(body, f"unexpected route {route!r} for {self.name}")

    def update_invalidates_cache(self, op: Operation, *, clear_cache_on_pause: bool = True) -> bool:
        return op in self.invalidating and clear_cache_on_pause


VLLM_SIDECAR = VllmSidecarFamily()
