"""The listener's namespace scope, written for the simulator straight from the contract (§1.6).

Deliberately independent of `controlplane.dynamo.scope`: the simulator is the reference the
client is tested against, so it must not share the client's code (a bug copied into both would
never be caught). `tests/unit/test_scope_agreement.py` checks the two against each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

_GLOBAL = "dynamo"


@dataclass(frozen=True, slots=True)
class ListenerScope:
    """What one frontend's RL listener reports: its `namespace` field and which workers match."""

    reported: str
    prefix: str | None  # set in prefix mode only
    everything: bool = False

    def matches(self, namespace: str) -> bool:
        if self.everything:
            return True
        if self.prefix is None:
            return namespace == self.reported
        # The namespace equals the prefix, or continues it right after a hyphen (case-sensitive).
        return namespace == self.prefix or namespace.startswith(f"{self.prefix}-")


def listener_scope(env: Mapping[str, str]) -> ListenerScope:
    """Rows 1-3 of §1.6: prefix first, then namespace plus suffix, then namespace alone.

    Empty values count as unset and nothing is trimmed.
    """
    prefix = env.get("DYN_NAMESPACE_PREFIX") or ""
    if prefix == _GLOBAL:
        return ListenerScope(reported=_GLOBAL, prefix=None, everything=True)
    if prefix:
        return ListenerScope(reported=prefix, prefix=prefix)
    base = env.get("DYN_NAMESPACE") or _GLOBAL
    suffix = env.get("DYN_NAMESPACE_WORKER_SUFFIX") or ""
    # The listener appends the suffix even when `base` already ends with it.
    return ListenerScope(reported=f"{base}-{suffix}" if suffix else base, prefix=None)
