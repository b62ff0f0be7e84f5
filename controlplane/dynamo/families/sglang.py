"""SGLang worker routes (contract §6). SGLang is not discovered: operators register its
`system_url` and an allowlisted route set, and `supports()` checks against that set.

- `pause_generation` / `continue_generation` are default top-level routes (tokenizer-manager
  target); their `None` result normalizes to `{"status":"ok"}`.
- Built-in `control/update_weights_from_disk`, `control/update_weights_from_distributed` and
  `control/update_weight_version` answer `{"success": bool, "message": ...}`: success needs
  `success: true`. Bad fields raise in SGLang → HTTP 500 "Handler error".
- Group init/destroy, flush and weight-version read have no built-in route: they need configured
  routes (`--engine-route init_weights_update_group` etc., engine target). Tuple results
  normalize to `{"success","message"}`.
- SGLang flushes its cache after a successful weight update when `flush_cache` is true; the disk
  update always sends it (and an explicit `abort_all_requests`), so updates invalidate the cache.
  Its reply's `num_paused_requests` says how many requests were paused across the update
  (`dynamo.inflight` accounts for them).
- Liveness: `GET {system_url}/health` expecting 200 `status: ready`.
- Pause modes are SGLang's (`abort` default, `retract`, `in_place`); `keep`/`wait` are vLLM's.
- Memory release/resume (`release_memory_occupation`/`resume_memory_occupation`, default routes)
  can serve as the pause method: see `refresh.planning`.
- A configured route may bind another path to a method (`flush=flush_cache`): `bound()` gives
  the family with that path for the operation (`sglang_routes.route_bindings`). Success is
  judged per operation, so a renamed path is read like the default one.
"""

from __future__ import annotations

from collections.abc import Iterable
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

PAUSE_MODES = ("abort", "retract", "in_place")

#: Operations whose reply must carry `success: true` (SGLang's update-style results, and the
#: `(success, message)` tuples the group methods return).
_SUCCESS_OPS = frozenset(
    {
        Operation.UPDATE_FROM_DISK,
        Operation.UPDATE_FROM_DISTRIBUTED,
        Operation.UPDATE_FROM_TENSOR,
        Operation.SET_WEIGHT_VERSION,
        Operation.INIT_WEIGHTS_GROUP,
        Operation.DESTROY_WEIGHTS_GROUP,
    }
)
#: SGLang's memory-occupation tags.
MEMORY_TAGS = ("weights", "kv_cache", "cuda_graph")


class SglangFamily(AdminFamily):
    name = "sglang"
    invalidating = frozenset(
        {
            Operation.UPDATE_FROM_DISK,
            Operation.UPDATE_FROM_DISTRIBUTED,
            Operation.UPDATE_FROM_TENSOR,
        }
    )
    pause_modes = PAUSE_MODES
    default_pause_mode = "abort"

    def __init__(
        self, paths: dict[Operation, str] | None = None, release: ReleaseContract | None = None
    ) -> None:
        self.release = release or contract(DEFAULT_RELEASE)
        #: The release's route table (`releases.Rules.sglang_routes`).
        self.defaults = {Operation(op): r for op, r in self.release.rules.sglang_routes.items()}
        self.paths = {**self.defaults, **(paths or {})}
        self.routes = {
            Operation.LIVENESS: frozenset(),
            **{op: frozenset({route}) for op, route in self.paths.items()},
        }

    def bound(self, methods: dict[str, str]) -> SglangFamily:
        """This family with configured paths: `methods` maps a method name (the default route
        name of an operation, e.g. `flush_cache`) to the path an operator bound it to."""
        by_route = {route: op for op, route in self.defaults.items()}
        paths = {by_route[m]: path for m, path in methods.items() if m in by_route}
        return SglangFamily(paths, self.release) if paths else self

    def gone_routes(self, routes: Iterable[str]) -> list[str]:
        """Allowlisted routes this release no longer serves (1.7 deleted the duplicate
        `control/{release,resume}_memory_occupation` handlers)."""
        return sorted(set(routes) & self.release.rules.sglang_gone_routes)

    def _build(self, op: Operation, params: dict[str, Any]) -> list[AdminCall]:
        if op == Operation.LIVENESS:
            reject_unknown(params, set())
            return [AdminCall(op, "GET", "health", None)]
        body: dict[str, Any] = {}
        if op in (Operation.RELEASE_MEMORY, Operation.RESUME_MEMORY):
            reject_unknown(params, {"tags"})
            tags = params.get("tags")
            if tags is not None:
                if not isinstance(tags, list) or not set(tags) <= set(MEMORY_TAGS):
                    raise ValueError(f"memory tags must be a subset of {', '.join(MEMORY_TAGS)}")
                body["tags"] = list(tags)
        elif op == Operation.PAUSE:
            reject_unknown(params, {"mode"})
            mode = params.get("mode")
            if mode is not None:
                if mode not in PAUSE_MODES:
                    raise ValueError(
                        f"invalid pause mode {mode!r}; expected abort|retract|in_place"
                    )
                body["mode"] = mode
        elif op == Operation.SET_WEIGHT_VERSION:
            reject_unknown(params, {"weight_version", "abort_all_requests"})
            body["new_version"] = require(params, "weight_version")
            body["abort_all_requests"] = bool(params.get("abort_all_requests", False))
        elif op == Operation.UPDATE_FROM_DISK:
            require(params, "model_path")
            if params.get("flush_cache") is False:
                # SGLang would keep the old-weights prefix cache while the plan says it is gone.
                raise ValueError("flush_cache=false would keep the old-weights prefix cache")
            body.update(params)  # SGLang's UpdateWeightFromDiskReqInput fields, verbatim
            # Always explicit: the cache reset is what makes the update invalidate the cache,
            # and `abort_all_requests`' default differs between SGLang builds. True drops what
            # was paused (a request never finishes on the new weights); the plan sends False
            # only when it declares that requests may straddle the update.
            body["flush_cache"] = True
            body["abort_all_requests"] = bool(params.get("abort_all_requests", True))
            body.update(self.release.rules.sglang_disk_extra)  # 1.7: keep_pause
        elif op in (
            Operation.UPDATE_FROM_DISTRIBUTED,
            Operation.UPDATE_FROM_TENSOR,
            Operation.INIT_WEIGHTS_GROUP,
            Operation.DESTROY_WEIGHTS_GROUP,
        ):
            body.update(params)  # SGLang's request fields, verbatim
        else:
            reject_unknown(params, set())
        return [AdminCall(op, "POST", engine(self.paths[op]), body)]

    def _accept(self, call: AdminCall, body: Any) -> AdminOutcome:
        if call.operation == Operation.LIVENESS:
            if not isinstance(body, dict) or body.get("status") != "ready":
                status = body.get("status") if isinstance(body, dict) else None
                return fail(body, f"health status is {status!r}, not 'ready'")
            return ok(body)
        route = call.route
        if call.operation in _SUCCESS_OPS:
            if not isinstance(body, dict) or body.get("success") is not True:
                return fail(body, f"{route} did not report success=true")
            if call.operation == Operation.SET_WEIGHT_VERSION:
                return ok(body, version=body.get("new_version"))
            return ok(body)
        if call.operation == Operation.GET_WEIGHT_VERSION:
            # A configured route; accept the shapes SGLang's normalization can produce.
            if isinstance(body, dict):
                for key in ("weight_version", "version", "result"):
                    if key in body:
                        version = body[key]
                        return ok(body, version=version, version_declared=version is not None)
            return fail(body, "get_weight_version reply lacks a version")
        # pause/continue/flush: `None` → {"status":"ok"}; tuple/dataclass → success flag.
        if isinstance(body, dict) and (body.get("status") == "ok" or body.get("success") is True):
            return ok(body)
        return fail(body, f"{route} reply is not a success body")


SGLANG = SglangFamily()
