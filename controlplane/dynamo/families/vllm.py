"""vLLM Python worker routes (contract §4): bare route names, `{"status":"ok"}` on success.

Cache: `update_weights_from_disk` resets the prefix cache itself, and
`update_weights_from_distributed` does too unless `reset_prefix_cache=false` is sent (we never
send it false), so FLUSH_CACHE after an update is optional (Dynamo ignores its result anyway).

Default pause mode: `wait`. Dynamo's own default is `keep`, which freezes the requests in flight
and lets them *continue under the new weights* after resume: samples that span two policies,
the thing RL frameworks fight (a rollout straddling a refit). Dynamo's current weight-update
guide pauses with `{"mode": "wait", "clear_cache": false}`: requests in flight finish on the
old weights, new ones queue. The drain is bounded by the pause call's own timeout (the
executor's admin timeout); a drain that outlasts it fails the pause step, which resumes the
worker. `keep` stays available when the plan declares that requests may straddle the update
(docs/reference/in-flight-requests.md).
"""

from __future__ import annotations

from typing import Any

from ..releases import (
    DECLARED_WHERE_ADVERTISED,
    DEFAULT_RELEASE,
    ReleaseContract,
    contract,
)
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

PAUSE_MODES = ("keep", "wait", "abort")

_LORA_OPS = frozenset({Operation.LOAD_LORA, Operation.SWAP_LORA, Operation.UNLOAD_LORA})


class VllmWorkerFamily(AdminFamily):
    """Routes and success rules from the release's contract (`releases.Rules`)."""

    name = "vllm"
    invalidating = frozenset({Operation.UPDATE_FROM_DISK, Operation.UPDATE_FROM_DISTRIBUTED})
    pause_modes = PAUSE_MODES
    default_pause_mode = "wait"

    def __init__(self, release: ReleaseContract | None = None) -> None:
        self.release = release or contract(DEFAULT_RELEASE)
        self._route = {Operation(op): r for op, r in self.release.rules.vllm_routes.items()}
        self.routes = {op: frozenset({route}) for op, route in self._route.items()}

    def _build(self, op: Operation, params: dict[str, Any]) -> list[AdminCall]:
        body: dict[str, Any] = {}
        if op == Operation.PAUSE:
            reject_unknown(params, {"mode", "clear_cache"})
            mode = params.get("mode")
            if mode is not None:
                if mode not in PAUSE_MODES:
                    raise ValueError(f"invalid pause mode {mode!r}; expected keep|wait|abort")
                body["mode"] = mode
            if params.get("clear_cache") is not None:
                body["clear_cache"] = bool(params["clear_cache"])
        elif op == Operation.UPDATE_FROM_DISK:
            reject_unknown(params, {"model_path", "weight_version", "engine_rpc"})
            body["model_path"] = require(params, "model_path")
            body.update({k: params[k] for k in ("weight_version", "engine_rpc") if k in params})
        elif op == Operation.SET_WEIGHT_VERSION:
            reject_unknown(params, {"weight_version"})
            if "weight_version" not in params:
                raise ValueError("missing required parameter 'weight_version'")
            body["weight_version"] = params["weight_version"]
        elif op == Operation.UPDATE_FROM_DISTRIBUTED:
            if params.get("reset_prefix_cache") is False:
                # Keeping the old cache after new weights is exactly what a refresh must avoid.
                raise ValueError("reset_prefix_cache=false would keep the old-weights cache")
            body.update(params)  # integration-specific kwargs are forwarded to the engine RPC
        elif op in (
            Operation.INIT_WEIGHTS_GROUP,
            Operation.DESTROY_WEIGHTS_GROUP,
            Operation.UPDATE_FROM_TENSOR,
        ):
            # Python workers take the group arguments flat (forwarded as engine RPC kwargs).
            body.update(params)
        elif op in (Operation.LOAD_LORA, Operation.SWAP_LORA):
            reject_unknown(params, {"lora_name", "uri"})
            body["lora_name"] = _lora_name(params)
            uri = require(params, "uri")
            if not isinstance(uri, str) or not uri.strip():
                raise ValueError("a LoRA adapter needs a source uri")
            body["source"] = {"uri": uri}
        elif op == Operation.UNLOAD_LORA:
            reject_unknown(params, {"lora_name"})
            body["lora_name"] = _lora_name(params)
        else:
            reject_unknown(params, set())
        return [AdminCall(op, "POST", engine(self._route[op]), body)]

    def _accept(self, call: AdminCall, body: Any) -> AdminOutcome:
        if call.operation in _LORA_OPS:
            return _accept_lora(call, body)
        if not isinstance(body, dict) or body.get("status") != "ok":
            return fail(body, f"expected status 'ok' from {call.route}, got {_status_of(body)}")
        op = call.operation
        if op == Operation.LIVENESS and body.get("alive") is not True:
            return fail(body, "liveness_probe did not report alive=true")
        if op == Operation.GET_WEIGHT_VERSION:
            declared = body.get("version_declared")
            if self.release.rules.vllm_version_declared == DECLARED_WHERE_ADVERTISED:
                if "version" not in body:
                    return fail(body, "get_weight_version reply lacks 'version'")
                # 1.7: a missing field means "not tracked" (None), never false; whether a
                # present one is trusted depends on `set_weight_version` being advertised,
                # which the plan knows (`planning.worker.verify_pass`).
                if "version_declared" in body and not isinstance(declared, bool):
                    return fail(body, "get_weight_version 'version_declared' is not a boolean")
                return ok(body, version=body["version"], version_declared=declared)
            if not isinstance(declared, bool) or "version" not in body:
                return fail(body, "get_weight_version reply lacks 'version'/'version_declared'")
            return ok(body, version=body["version"], version_declared=declared)
        if op in (Operation.UPDATE_FROM_DISK, Operation.UPDATE_FROM_DISTRIBUTED):
            return ok(body, version_declared=body.get("version_declared") is True)
        return ok(body)


def _lora_name(params: dict[str, Any]) -> str:
    name = require(params, "lora_name")
    if not isinstance(name, str) or not name.strip():
        raise ValueError("lora_name must be a non-empty string")
    return name


def _accept_lora(call: AdminCall, body: Any) -> AdminOutcome:
    """LoRA routes answer `status: success` (not `ok`). A swap must really swap: without
    `DYN_LORA_HOTSWAP_ENABLED` a reload of a loaded name is a no-op that still says success."""
    if not isinstance(body, dict) or body.get("status") != "success":
        return fail(body, f"expected status 'success' from {call.route}, got {_status_of(body)}")
    if call.operation == Operation.SWAP_LORA and body.get("hot_swap") is not True:
        return fail(
            body,
            "load_lora did not hot-swap the adapter (is DYN_LORA_HOTSWAP_ENABLED set on the "
            f"worker?): {body.get('message')!r}",
        )
    # A plain load of a name already loaded answers success too (Dynamo: idempotent), which is
    # what makes a retried load safe.
    return ok(body)


def _status_of(body: Any) -> str:
    if isinstance(body, dict):
        return repr(body.get("status"))
    return f"a {type(body).__name__} body"


VLLM_WORKER = VllmWorkerFamily()
