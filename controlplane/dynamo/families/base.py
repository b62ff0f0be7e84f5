"""What every admin route family shares: operations, calls, outcomes, failure detection.

A family knows, per operation, which advertised routes it needs, which HTTP calls to make (route
names verbatim, never rewritten), and how to tell success from failure. HTTP 200 can carry an
error, so success always needs a 2xx status *and* a success body.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..errors import one_line


class Operation(enum.StrEnum):
    LIVENESS = "liveness"
    PAUSE = "pause"
    RESUME = "resume"
    FLUSH_CACHE = "flush_cache"
    UPDATE_FROM_DISK = "update_from_disk"
    INIT_WEIGHTS_GROUP = "init_weights_group"
    UPDATE_FROM_DISTRIBUTED = "update_from_distributed"
    DESTROY_WEIGHTS_GROUP = "destroy_weights_group"
    GET_WEIGHT_VERSION = "get_weight_version"
    SET_WEIGHT_VERSION = "set_weight_version"
    UPDATE_FROM_TENSOR = "update_from_tensor"
    LOAD_LORA = "load_lora"
    #: `load_lora` of an adapter name already loaded, which must report a hot swap.
    SWAP_LORA = "swap_lora"
    UNLOAD_LORA = "unload_lora"
    RELEASE_MEMORY = "release_memory"
    RESUME_MEMORY = "resume_memory"
    IS_PAUSED = "is_paused"
    IS_SLEEPING = "is_sleeping"
    SLEEP = "sleep"
    WAKE_UP = "wake_up"
    #: An allowlisted route of a statically configured worker, called verbatim.
    CUSTOM = "custom"


class UnsupportedOperation(ValueError):
    """The family has no way to perform this operation (e.g. no flush route on the sidecar)."""


@dataclass(frozen=True, slots=True)
class AdminCall:
    """One HTTP call. `path` is relative to `system_url` (e.g. `engine/pause_generation`)."""

    operation: Operation
    method: str
    path: str
    body: dict[str, Any] | None = None

    @property
    def route(self) -> str | None:
        """The advertised route name this call uses, or None for non-engine paths (`health`)."""
        return self.path.removeprefix("engine/") if self.path.startswith("engine/") else None


@dataclass(frozen=True, slots=True)
class AdminOutcome:
    ok: bool
    error: str | None = None
    data: dict[str, Any] = field(default_factory=dict)


def engine(route: str) -> str:
    """The system-server path for an advertised route, verbatim (`control/x` stays `control/x`)."""
    return "engine/" + route


def body_message(body: Any) -> str | None:
    """The human message of a reply: `message`, else `error`, else None."""
    if isinstance(body, dict):
        message = body.get("message")
        error = body.get("error")
        if isinstance(message, str) and message:
            # System-server errors carry both: {"error":"Handler error","message":"..."}.
            if isinstance(error, str) and error and error != message:
                return f"{error}: {message}"
            return message
        if isinstance(error, str) and error:
            return error
    return None


def describe(body: Any) -> str:
    message = body_message(body)
    if message is not None:
        return one_line(message, 300)
    if body is None:
        return "empty body"
    return one_line(repr(body), 200)


def generic_failure(http_status: int, body: Any) -> str | None:
    """Failures that look the same in every family. None when nothing generic is wrong."""
    if not 200 <= http_status < 300:
        return f"HTTP {http_status}: {describe(body)}"
    if isinstance(body, dict):
        status = body.get("status")
        # Python vLLM compares exactly; the Rust wrapper case-insensitively. Be the stricter
        # reader: any spelling of "error" is a failure.
        if isinstance(status, str) and status.lower() == "error":
            return body_message(body) or "worker reported status=error without a message"
        if body.get("success") is False:
            return body_message(body) or "worker reported success=false without a message"
    return None


class AdminFamily:
    """Base adapter. Subclasses fill `routes` and override `_build`/`_accept`."""

    name: str = ""
    #: Advertised routes each operation needs; operations absent here are unsupported.
    routes: dict[Operation, frozenset[str]] = {}
    #: Operations whose update sequence (as built here) leaves no old-weights prefix cache.
    invalidating: frozenset[Operation] = frozenset()
    #: Pause modes the family's pause route accepts, and the one it uses when none is chosen
    #: (its own default, so "auto" never sends a mode the worker would refuse).
    pause_modes: tuple[str, ...] = ()
    default_pause_mode: str = ""

    def required_routes(self, op: Operation) -> frozenset[str]:
        if op not in self.routes:
            raise UnsupportedOperation(f"{self.name} has no route for {op.value}")
        return self.routes[op]

    def supports(
        self, op: Operation, routes: frozenset[str] | set[str] | tuple[str, ...] | list[str]
    ) -> bool:
        """True when `op` is possible with the advertised `routes` (capability check)."""
        if op not in self.routes:
            return False
        return self.routes[op] <= frozenset(routes)

    def missing_routes(self, op: Operation, routes: Iterable[str]) -> frozenset[str]:
        return self.required_routes(op) - frozenset(routes)

    def build(self, op: Operation, **params: Any) -> list[AdminCall]:
        """The calls for `op`, in order. Raises UnsupportedOperation / ValueError on bad params."""
        self.required_routes(op)
        return self._build(op, params)

    def interpret(self, call: AdminCall, http_status: int, body: Any) -> AdminOutcome:
        """Success needs a 2xx status, no error markers, and the family's success body.

        A verdict reads the call's operation and route, never its request body: `ReplyCache`
        keeps one verdict per (family, operation, path, status, reply) for a whole run."""
        problem = generic_failure(http_status, body)
        if problem is not None:
            return AdminOutcome(False, problem, body if isinstance(body, dict) else {})
        if call.operation == Operation.CUSTOM:
            return accept_custom(call, body)
        return self._accept(call, body)

    def pause_mode_for(self, requested: str) -> str:
        """The mode to send for `requested` (`auto` = the family's default); raises ValueError
        naming the modes this family has when it has no such mode."""
        if requested in ("", "auto"):
            return self.default_pause_mode
        if requested not in self.pause_modes:
            raise ValueError(
                f"{self.name} has no pause mode {requested!r}; "
                f"choose one of {', '.join(self.pause_modes)}"
            )
        return requested

    def update_invalidates_cache(self, op: Operation) -> bool:
        """Whether a successful `op` (as built here) already dropped the old prefix cache, so a
        separate FLUSH_CACHE is unnecessary."""
        return op in self.invalidating

    # -- subclass hooks ----------------------------------------------------------------------

    def _build(self, op: Operation, params: dict[str, Any]) -> list[AdminCall]:
        raise NotImplementedError

    def _accept(self, call: AdminCall, body: Any) -> AdminOutcome:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<AdminFamily {self.name}>"


def custom_call(route: str, body: dict[str, Any] | None) -> AdminCall:
    """A call of an allowlisted route on a statically configured worker, verbatim."""
    return AdminCall(Operation.CUSTOM, "POST", engine(route), dict(body or {}))


def accept_custom(call: AdminCall, body: Any) -> AdminOutcome:
    """A custom route's reply shape is the operator's; it must still say it succeeded in one of
    the ways Dynamo's backends do (`status` ok/success, or `success: true`)."""
    if isinstance(body, dict) and (
        body.get("status") in ("ok", "success") or body.get("success") is True
    ):
        return ok(body)
    return fail(body, f"{call.route} did not report status ok/success or success=true")


def require(params: dict[str, Any], name: str) -> Any:
    if params.get(name) is None:
        raise ValueError(f"missing required parameter {name!r}")
    return params[name]


def reject_unknown(params: dict[str, Any], allowed: set[str]) -> None:
    unknown = set(params) - allowed
    if unknown:
        raise ValueError(f"unknown parameters: {', '.join(sorted(unknown))}")


def as_dict(body: Any) -> dict[str, Any]:
    return dict(body) if isinstance(body, dict) else {}


def ok(body: Any, **extra: Any) -> AdminOutcome:
    return AdminOutcome(True, None, {**as_dict(body), **extra})


def fail(body: Any, reason: str) -> AdminOutcome:
    return AdminOutcome(False, reason, as_dict(body))
