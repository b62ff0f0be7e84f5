"""The revision each polled gate has committed, read in rounds that polls share.

The fast path (`fast_gate`) answers a poll from a gate's Redis copy only at the revision the
gate row has in the database now (`refresh/gate_cache.py` says why). One query per poll would
put the database behind every poll; instead each process reads in rounds: one query for every
gate asked about while the previous round was in flight. A poll joins the next round to
start, never one already running, whose read may have been taken before a close this poll
must see: every answer rests on a read that began after its poll arrived. At concurrency 64 a
round serves dozens of polls; an idle gate costs one indexed read per poll.

A round that cannot read the database answers None, and the poll goes to Django (which
answers from the row, or with the database's error): no copy is used unchecked.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import weakref

from django.db import DatabaseError, connections

from controlplane.refresh.gate_cache import Committed, Scope, committed_revisions

logger = logging.getLogger(__name__)

Found = dict[Scope, Committed] | None


class Rounds:
    """The rounds of one event loop: at most one read running and one gathering polls."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.gathering: set[Scope] = set()
        self.next: asyncio.Future[Found] | None = None
        self.running = False

    async def revision(self, scope: Scope) -> Committed | None:
        if self.next is None:
            self.next = self.loop.create_future()
            self.gathering = set()
        self.gathering.add(scope)
        joined = self.next
        if not self.running:
            # Started on the loop's next turn, not now: every poll this turn reaches joins it.
            self.running = True
            self.loop.call_soon(self._start)
        found = await asyncio.shield(joined)
        return None if found is None else found.get(scope)

    def _start(self) -> None:
        future, scopes = self.next, self.gathering
        assert future is not None
        self.next, self.gathering = None, set()
        job = self.loop.run_in_executor(_reader, _read, frozenset(scopes))

        def done(job: asyncio.Future[Found]) -> None:
            future.set_result(None if job.cancelled() or job.exception() else job.result())
            if self.next is not None:
                self.loop.call_soon(self._start)  # the polls that came meanwhile, and this turn's
            else:
                self.running = False

        job.add_done_callback(done)


#: One thread per process reads every round: rounds never overlap within a loop, so one thread
#: is enough. Its connection goes back to the pool after each round: a connection kept for the
#: process's life would be one the requests can never have (with a pool of one, none at all).
_reader = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="gate-revisions")


def _read(scopes: frozenset[Scope]) -> Found:
    try:
        return committed_revisions(scopes)
    except DatabaseError:
        logger.warning("gate revisions unreadable; polls go to Django", exc_info=True)
        return None
    finally:
        connections.close_all()  # back to the pool (a broken one is dropped and replaced)


_rounds: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Rounds] = weakref.WeakKeyDictionary()


async def committed_revision(source: str, namespace: str) -> Committed | None:
    """The gate's revision and its source's policy mark in the database, read after this call
    began; None: unknown (the database could not be read)."""
    loop = asyncio.get_running_loop()
    rounds = _rounds.get(loop)
    if rounds is None:
        rounds = _rounds[loop] = Rounds(loop)
    return await rounds.revision((source, namespace))
