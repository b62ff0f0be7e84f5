"""Simulated collective weight-update groups (NCCL-style rendezvous) across the fleet.

A group is named by `(master_address, master_port, group_name)`, as a TCP-store rendezvous is.
Each worker joining takes ranks `rank_offset .. rank_offset + its world_size - 1`; the group
forms only when every rank `0 .. world_size - 1` is held, so a join blocks until then. The
trainer's ranks (`0 .. trainer_ranks - 1`, the fleet's `trainer_ranks`) are held by a stand-in
trainer that joins at once — simulation choice: the trainer side lives outside Dynamo.

The stand-in trainer broadcasts only when told (`broadcast()`, control API `POST
/_sim/groups/broadcast`), so a worker that applies before the trainer broadcast fails, like a
receive that never got its data. A worker whose join outlives its watchdog is handled by its
family (vLLM: the process exits; see `workers/vllm.py`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any


class JoinError(ValueError):
    """The join cannot succeed (bad arguments, a rank taken twice, a world size mismatch)."""


@dataclass
class Group:
    name: tuple[str, int, str]
    world_size: int
    #: rank → the token of the worker holding it ("trainer" for the stand-in trainer).
    holders: dict[int, str] = field(default_factory=dict)
    formed: asyncio.Event = field(default_factory=asyncio.Event)
    #: The version the stand-in trainer last broadcast (None until it does).
    broadcast_version: Any = None
    broadcasts: int = 0
    destroyed_by: set[str] = field(default_factory=set)

    def view(self) -> dict[str, Any]:
        return {
            "master_address": self.name[0],
            "master_port": self.name[1],
            "group_name": self.name[2],
            "world_size": self.world_size,
            "joined": len(self.holders),
            "formed": self.formed.is_set(),
            "ranks": {str(r): t for r, t in sorted(self.holders.items())},
            "broadcast_version": self.broadcast_version,
            "broadcasts": self.broadcasts,
        }


def group_key(info: dict[str, Any]) -> tuple[str, int, str]:
    try:
        return (
            str(info["master_address"]),
            int(info["master_port"]),
            str(info.get("group_name", "weight_update_group")),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise JoinError(f"invalid group arguments: {exc}") from None


class Collectives:
    """Every group of one fleet. Runs on the fleet's event loop: no thread locks."""

    def __init__(self, trainer_ranks: int = 1) -> None:
        self.trainer_ranks = trainer_ranks
        self.groups: dict[tuple[str, int, str], Group] = {}

    def join(self, token: str, info: dict[str, Any], ranks: int) -> Group:
        """Take this worker's ranks; raises JoinError. Does not wait (see `wait_formed`)."""
        name = group_key(info)
        try:
            offset, world = int(info["rank_offset"]), int(info["world_size"])
        except (KeyError, TypeError, ValueError):
            raise JoinError("init needs integer rank_offset and world_size") from None
        if world < 1 or offset < 0 or offset + ranks > world:
            raise JoinError(
                f"ranks {offset}..{offset + ranks - 1} do not fit a world of size {world}"
            )
        group = self.groups.get(name)
        if group is None:
            group = Group(name, world)
            group.holders.update({r: "trainer" for r in range(min(self.trainer_ranks, world))})
            self.groups[name] = group
        if group.world_size != world:
            raise JoinError(f"world_size {world} differs from the group's {group.world_size}")
        for rank in range(offset, offset + ranks):
            holder = group.holders.get(rank)
            if holder is not None and holder != token:
                raise JoinError(f"rank {rank} is already held in group {name[2]!r}")
        for rank in range(offset, offset + ranks):
            group.holders[rank] = token
        if len(group.holders) == group.world_size:
            group.formed.set()
        return group

    def leave(self, token: str) -> None:
        """A member died or destroyed the group: its ranks are free again."""
        for name, group in list(self.groups.items()):
            if token not in group.holders.values():
                continue
            group.holders = {r: t for r, t in group.holders.items() if t != token}
            # A group missing a rank is no group: it must form again before any broadcast.
            group.formed = asyncio.Event()
            group.broadcast_version = None
            members = {t for t in group.holders.values() if t != "trainer"}
            if not members:
                self.groups.pop(name, None)

    def broadcast(self, version: Any, group_name: str | None = None) -> int:
        """The stand-in trainer broadcasts `version` to every formed group (or the named one).
        Returns how many groups received it."""
        count = 0
        for group in self.groups.values():
            if group.formed.is_set() and group_name in (None, group.name[2]):
                group.broadcast_version = version
                group.broadcasts += 1
                count += 1
        return count

    def group_of(self, token: str) -> Group | None:
        for group in self.groups.values():
            if token in group.holders.values():
                return group
        return None

    def views(self) -> list[dict[str, Any]]:
        return [g.view() for g in self.groups.values()]


async def wait_formed(group: Group, timeout: float, stopping: asyncio.Event) -> bool:
    """Wait until every rank joined; False when `timeout` passes (or the fleet stops)."""
    formed = asyncio.ensure_future(group.formed.wait())
    stop = asyncio.ensure_future(stopping.wait())
    try:
        await asyncio.wait({formed, stop}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        formed.cancel()
        stop.cancel()
    return group.formed.is_set()
