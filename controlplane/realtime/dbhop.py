"""Calls to the database thread from the event loop, batched: one hop for all waiting now.

`database_sync_to_async` runs every call of a process in the same single thread anyway, so a
batch loses no parallelism; it saves the per-call handoff (futures, a thread wake-up,
close_old_connections twice) that, times thousands of subscribers, was the fan-out.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import Any

from channels.db import database_sync_to_async


class _OrmHops:
    """Calls waiting for the database thread, taken there together: one hop per batch.

    `database_sync_to_async` runs every call of a process in the same single thread anyway,
    so a batch loses no parallelism; it saves the per-call handoff (futures, a thread wake-up,
    close_old_connections twice) that, times thousands of subscribers, was the fan-out.
    """

    def __init__(self) -> None:
        self.waiting: list[tuple[Callable[[], Any], asyncio.Future[Any]]] = []
        self.running = False
        self.task: asyncio.Task[None] | None = None  # held: the loop keeps only a weak one

    async def run(self) -> None:
        batch: list[tuple[Callable[[], Any], asyncio.Future[Any]]] = []
        try:
            while self.waiting:
                batch, self.waiting = self.waiting, []
                outcomes = await database_sync_to_async(call_each)([call for call, _ in batch])
                for (_, future), (ok, value) in zip(batch, outcomes, strict=True):
                    if future.done():  # its subscriber went away meanwhile
                        continue
                    if ok:
                        future.set_result(value)
                    else:
                        future.set_exception(value)
                batch = []
        finally:
            self.running = False
            for _, future in batch + self.waiting:  # cancelled mid-hop: nobody waits forever
                future.cancel()
            self.waiting = []


def call_each(calls: list[Callable[[], Any]]) -> list[tuple[bool, Any]]:
    outcomes: list[tuple[bool, Any]] = []
    for call in calls:
        try:
            outcomes.append((True, call()))
        except Exception as exc:  # raised to its own caller, not to the batch
            outcomes.append((False, exc))
    return outcomes


_hops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _OrmHops] = weakref.WeakKeyDictionary()


async def orm_hop(call: Callable[[], Any]) -> Any:
    """`call()` in the database thread, batched with every other call waiting right now."""
    loop = asyncio.get_running_loop()
    hops = _hops.get(loop)
    if hops is None:
        hops = _hops[loop] = _OrmHops()
    future: asyncio.Future[Any] = loop.create_future()
    hops.waiting.append((call, future))
    if not hops.running:
        hops.running = True
        hops.task = loop.create_task(hops.run())
    return await future
