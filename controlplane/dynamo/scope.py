"""Namespace scope rules of the Dynamo RL discovery listener (contract §1.6).

The frontend's `/v1/rl/workers` listener decides which worker namespaces it reports from three
environment variables. The rules have sharp edges (a `dynamo` prefix means *every* namespace, a
prefix ending in `-` matches nothing, the suffix is always appended by the listener but skipped by
native sidecars when already present), so they live here as one pure function with a
human-readable explanation that the UI shows next to a source.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

#: The cluster-wide namespace name. As a prefix it switches the listener to global mode.
GLOBAL_NAMESPACE = "dynamo"

ENV_NAMESPACE = "DYN_NAMESPACE"
ENV_PREFIX = "DYN_NAMESPACE_PREFIX"
ENV_WORKER_SUFFIX = "DYN_NAMESPACE_WORKER_SUFFIX"

ScopeMode = Literal["exact", "prefix", "global"]


@dataclass(frozen=True, slots=True)
class Scope:
    """The set of worker namespaces one RL listener reports.

    `namespace` is what the listener reports as the top-level `namespace` of its response: the
    exact name, the prefix itself, or `dynamo` in global mode.
    """

    mode: ScopeMode
    namespace: str

    def __post_init__(self) -> None:
        if self.mode not in ("exact", "prefix", "global"):
            raise ValueError(f"unknown scope mode {self.mode!r}")

    @property
    def is_global(self) -> bool:
        """True when the scope covers every namespace in the cluster (the `dynamo` prefix)."""
        return self.mode == "global"

    def matches(self, namespace: str) -> bool:
        """Whether a worker registered in `namespace` is reported by this listener.

        Matching is case-sensitive. A prefix matches itself or itself followed immediately by
        `-`, so `prod` matches `prod-a` but not `prodx`, and `prod-` matches nothing useful
        (`prod-a` does not start with `prod--`).
        """
        if self.mode == "global":
            return True
        if self.mode == "exact":
            return namespace == self.namespace
        return namespace == self.namespace or namespace.startswith(self.namespace + "-")

    def explain(self) -> str:
        """One line for people: what this scope matches and the surprising cases it does not."""
        ns = self.namespace
        if self.mode == "global":
            return f"global (prefix `{GLOBAL_NAMESPACE}`): matches every namespace in the cluster"
        if self.mode == "exact":
            return f"exact `{ns}`: matches only `{ns}` (case-sensitive), not `{ns}-*`"
        if ns.endswith("-"):
            return (
                f"prefix `{ns}`: matches only a namespace named exactly `{ns}`; a trailing `-` "
                f"never matches generations like `{ns}a`"
            )
        return f"prefix `{ns}`: matches `{ns}` and `{ns}-*` generations, not `{ns}2`"

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Scope:
        """Resolve the scope a frontend started with this environment would use."""
        return resolve_scope(
            namespace=env.get(ENV_NAMESPACE),
            prefix=env.get(ENV_PREFIX),
            worker_suffix=env.get(ENV_WORKER_SUFFIX),
        )


def _base_namespace(namespace: str | None) -> str:
    # Unset and empty both mean the default namespace; the default stays *exact*, not global.
    return namespace if namespace else GLOBAL_NAMESPACE


def resolve_scope(
    namespace: str | None = None,
    prefix: str | None = None,
    worker_suffix: str | None = None,
) -> Scope:
    """Apply the listener's precedence: prefix, then namespace+suffix, then namespace.

    Empty strings count as unset, exactly like the frontend. Values are not trimmed: the
    listener compares them verbatim.
    """
    if prefix:
        if prefix == GLOBAL_NAMESPACE:
            return Scope("global", GLOBAL_NAMESPACE)
        return Scope("prefix", prefix)
    base = _base_namespace(namespace)
    if worker_suffix:
        # The listener always appends, even when `base` already ends with the suffix.
        return Scope("exact", f"{base}-{worker_suffix}")
    return Scope("exact", base)


def python_worker_namespace(base: str | None, suffix: str | None) -> str:
    """Namespace a Python worker (`get_worker_namespace`) registers in: always appends."""
    ns = _base_namespace(base)
    return f"{ns}-{suffix}" if suffix else ns


def sidecar_namespace(base: str | None, suffix: str | None) -> str:
    """Namespace a native Rust sidecar registers in: appends unless already present.

    "Already present" is read as "ends with `-{suffix}`", so `prod-a` + `a` stays `prod-a`
    while the listener looks for `prod-a-a` — the mismatch the contract warns about.
    """
    ns = _base_namespace(base)
    if not suffix or ns.endswith(f"-{suffix}"):
        return ns
    return f"{ns}-{suffix}"
