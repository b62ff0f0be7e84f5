"""Listener entries we could not read, kept in view: fail closed instead of dropping them.

The integration reference says to fail closed when a required worker is unavailable. An entry
our parser rejects (`DiscoveryResult.rejected`) is exactly that: a worker the listener reports,
possibly serving, that we cannot identify or reach. So:

- when the entry still names its namespace (a string `namespace`), it is an unavailable
  worker *of that namespace*: plans and reopens covering it block with the rejection reason;
- otherwise the whole listing is partial: any plan or reopen of the source blocks.

A namespace with such an entry is never opened as fully verified.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

from controlplane.dynamo.listing import RejectedEntry
from controlplane.fleet.models import DiscoveryRun
from controlplane.jsontypes import OpaqueJson

#: How many rejections one blocker names before it only counts.
NAMED = 3


class RejectedEntryJson(TypedDict):
    """One entry of `DiscoveryRun.rejected_entries` (`stored_rejections`); this module owns
    its keys: the entry's index in the listing, why it was refused, and the entry itself."""

    index: int
    reason: str
    #: The listener's entry as received (or a truncated JSON text of it): outside data.
    raw: OpaqueJson


def stored_rejections(rejected: Iterable[RejectedEntry]) -> list[RejectedEntryJson]:
    """Rejected listener entries as a discovery run stores them."""
    return [RejectedEntryJson(index=r.index, reason=r.reason, raw=r.raw) for r in rejected]


@dataclass(frozen=True, slots=True)
class Rejection:
    index: int
    reason: str
    #: The namespace the entry names, or None when it is unreadable.
    namespace: str | None
    #: `component/instance_id` where the raw entry shows them, for people.
    label: str

    @classmethod
    def of(cls, entry: RejectedEntry | Mapping[str, Any]) -> Rejection:
        if isinstance(entry, RejectedEntry):
            index, reason, raw = entry.index, entry.reason, entry.raw
        else:
            index, reason, raw = entry.get("index", -1), entry.get("reason", ""), entry.get("raw")
        namespace = None
        label = ""
        if isinstance(raw, dict):
            ns = raw.get("namespace")
            namespace = ns if isinstance(ns, str) else None
            parts = [raw.get("component"), raw.get("instance_id")]
            label = "/".join(str(p) for p in parts if isinstance(p, str | int))
        return cls(int(index) if isinstance(index, int) else -1, str(reason), namespace, label)

    def describe(self) -> str:
        what = f"listener entry #{self.index}" + (f" ({self.label})" if self.label else "")
        if self.namespace is None:
            return f"{what}, namespace unreadable, rejected: {self.reason}"
        return f"{what} in namespace {self.namespace!r} rejected: {self.reason}"


def rejections(entries: Iterable[RejectedEntry | Mapping[str, Any]]) -> list[Rejection]:
    return [Rejection.of(e) for e in entries]


def blocking(
    entries: Iterable[RejectedEntry | Mapping[str, Any]], namespaces: Iterable[str] | None
) -> list[Rejection]:
    """The rejections that concern `namespaces` (None: every namespace of the source): those
    naming one of them and every one whose namespace is unreadable."""
    wanted = None if namespaces is None else set(namespaces)
    return [
        r
        for r in rejections(entries)
        if r.namespace is None or wanted is None or r.namespace in wanted
    ]


def blocker_text(found: list[Rejection]) -> str:
    """One line for a plan or a hold: why we fail closed, naming the first few entries."""
    if not found:
        return ""
    partial = any(r.namespace is None for r in found)
    head = (
        "the listing is partial (an entry's namespace is unreadable)"
        if partial
        else "a worker the listener reports could not be read"
    )
    named = "; ".join(r.describe() for r in found[:NAMED])
    more = f"; and {len(found) - NAMED} more" if len(found) > NAMED else ""
    return f"{head}: {named}{more}; failing closed until the listener's answer is readable"


def latest_rejections(source) -> list[Rejection]:
    """The rejected entries of the source's last successful discovery (the one its workers
    come from); empty when it had none or the source was never read."""
    entries = (
        DiscoveryRun.objects.filter(source=source, ok=True)
        .order_by("-started_at")
        .values_list("rejected_entries", flat=True)
        .first()
    )
    return rejections(entries or [])
