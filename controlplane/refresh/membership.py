"""`PolicyRefresh.membership_change`: who left, joined or changed when a membership check held.

This module owns the column's keys (`MembershipChange`). The `resolve` and `reopen` steps write
it when their check finds a change and clear it when the check passes; the hold's banner and the
"resolve membership" action read exactly what was found, through the helpers here.
"""

from __future__ import annotations

from typing import TypedDict, cast


class ChangedWorker(TypedDict):
    """A worker still listed but not the one verified (a probe error, a moved admin route)."""

    key: str
    detail: str


class MembershipChange(TypedDict, total=False):
    """What a membership check found; empty when it passed."""

    #: The step whose check found it (resolve or reopen).
    step: str
    #: The namespaces the change touches.
    namespaces: list[str]
    left: list[str]
    joined: list[str]
    changed: list[ChangedWorker]


def change_of(refresh) -> MembershipChange:
    """The stored change (empty when none)."""
    return cast(MembershipChange, refresh.membership_change or {})


def has_change(change: MembershipChange) -> bool:
    return any(change.get(k) for k in ("left", "joined", "changed"))


def changed_details(change: MembershipChange) -> dict[str, str]:
    """Changed workers' keys with what changed."""
    return {c["key"]: c["detail"] for c in change.get("changed", [])}


def dropped_keys(change: MembershipChange) -> set[str]:
    """Resolving drops the workers that left and those that changed."""
    return set(change.get("left", [])) | set(changed_details(change))


def left_out_keys(change: MembershipChange) -> set[str]:
    """Resolving leaves the joiners out of the verified set, and the changed workers too (they
    are still listed: the reopen must not see them join)."""
    return set(change.get("joined", [])) | set(changed_details(change))
