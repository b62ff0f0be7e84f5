"""SGLang's configured engine routes: `--engine-route` / `DYN_SGLANG_ENGINE_ROUTES`.

Grammar `path[=method][:engine|tm]` (contract §6), parsed with the rules and the exact error
messages of Dynamo 1.6.1's `dynamo.sglang.engine_routes.parse_engine_route_descriptors`, plus
the registration checks an operator's route list can fail without a running engine (a path
that collides with a built-in route). Whether `method` exists on the target is only known to
the worker; a route it cannot serve answers 404 and the call fails like any other.

The control plane calls the configured *path* verbatim; the *method* only tells it which
operation the path performs (`flush=flush_cache` makes `/engine/flush` the flush route).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

_ROUTE_SEGMENT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")
TARGETS = ("engine", "tm")

#: Registered by Dynamo whatever the configuration; a configured path may not reuse them.
BUILT_IN_ROUTES = frozenset(
    {
        "control/start_profile",
        "control/stop_profile",
        "control/update_weights_from_disk",
        "control/update_weights_from_tensor",
        "control/update_weights_from_distributed",
        "control/update_weights_from_ipc",
        "control/update_weight_version",
        "control/scale_elastic_ep",
        "control/is_scaling_elastic_ep",
        "update/model_taints",
    }
)
#: Served without configuration (tokenizer-manager target); a configured path overrides one.
DEFAULT_NATIVE_ROUTES = (
    "pause_generation",
    "continue_generation",
    "release_memory_occupation",
    "resume_memory_occupation",
)


@dataclass(frozen=True, slots=True)
class EngineRoute:
    """One configured public path bound to one SGLang method on a target."""

    path: str
    method: str
    target: Literal["engine", "tm"] = "engine"

    def descriptor(self) -> str:
        method = "" if self.method == self.path else f"={self.method}"
        return f"{self.path}{method}:{self.target}"


def _invalid(descriptor: str, message: str) -> ValueError:
    return ValueError(f"Invalid SGLang engine route descriptor {descriptor!r}: {message}")


def parse_engine_routes(values: str | Sequence[str] | None) -> list[EngineRoute]:
    """Parse descriptors (a whitespace-separated string, as in `DYN_SGLANG_ENGINE_ROUTES`, or
    a list, as with repeated `--engine-route`). Raises ValueError with Dynamo's message."""
    if values is None:
        return []
    if isinstance(values, str):
        if not values.strip():
            return []
        raw = values.split()
    else:
        raw = list(values)
    routes: list[EngineRoute] = []
    paths: set[str] = set()
    for position, item in enumerate(raw, start=1):
        if not isinstance(item, str):
            raise ValueError(
                f"Invalid SGLang engine route descriptor at position {position}: expected a string"
            )
        descriptor = item.strip()
        if not descriptor:
            raise ValueError(
                f"Invalid SGLang engine route descriptor at position {position}: "
                "descriptor is empty"
            )
        if descriptor.count(":") > 1:
            raise _invalid(descriptor, "expected at most one ':' target separator")
        route_and_method, separator, target = descriptor.rpartition(":")
        if separator:
            if not route_and_method or not target:
                raise _invalid(descriptor, "both the route and target are required")
            if target not in TARGETS:
                raise _invalid(descriptor, f"unknown target {target!r}; expected 'engine' or 'tm'")
        else:
            route_and_method, target = descriptor, "engine"
        if route_and_method.count("=") > 1:
            raise _invalid(descriptor, "expected at most one '=' method separator")
        path, has_method, method = route_and_method.partition("=")
        if not has_method:
            method = path
        if not path or not method:
            raise _invalid(descriptor, "both the route path and method are required")
        if any(not _ROUTE_SEGMENT_RE.fullmatch(segment) for segment in path.split("/")):
            raise _invalid(
                descriptor,
                "the route path must contain non-empty '/'-separated segments "
                "using only letters, digits, '.', '_', and '-'",
            )
        if not method.isidentifier():
            raise _invalid(descriptor, f"method {method!r} is not a Python identifier")
        if method.startswith("_"):
            raise _invalid(descriptor, "private methods cannot be exposed")
        if path in paths:
            raise _invalid(descriptor, f"route path {path!r} is configured more than once")
        if path in BUILT_IN_ROUTES:
            raise ValueError(
                f"Configured SGLang engine route /engine/{path} collides with a built-in route"
            )
        paths.add(path)
        routes.append(EngineRoute(path, method, "tm" if target == "tm" else "engine"))
    return routes


def is_descriptor(entry: str) -> bool:
    """Whether an allowlist entry binds a method or target (`path=method`, `path:tm`)."""
    return "=" in entry or ":" in entry


def route_bindings(allowlist: Iterable[str]) -> tuple[list[str], dict[str, str]]:
    """An SGLang worker's allowlist → (the paths it serves, method → path for configured
    routes whose method is not their path). Plain entries are paths called as they are;
    descriptor entries are parsed (ValueError on a bad one)."""
    entries = [e for e in allowlist if e]
    descriptors = parse_engine_routes([e for e in entries if is_descriptor(e)])
    plain = [e for e in entries if not is_descriptor(e)]
    paths = sorted({*plain, *(d.path for d in descriptors)})
    return paths, {d.method: d.path for d in descriptors if d.method != d.path}
