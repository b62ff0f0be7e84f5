"""The revision each polled gate has committed, read in rounds that polls share.

The fast path (`fast_gate`) answers a poll from a gate's Redis copy only at the revision the
gate row has in the database now (`refresh/gate_cache.py` says why). One query per poll would
put the database behind every poll; instead each process reads in rounds: one query for every
gate asked about while the previous round was in flight. A poll joins the next round to
start, never one already running, whose read may have been taken before a close this poll
must see: every answer rests on a read that began after its poll arrived. At concurrency 64 a
round serves dozens of polls; an idle gate costs one indexed read per poll.

The rounds run on the event loop itself, over one asynchronous connection of their own per
loop (autocommit, so each read sees everything committed before it began). They borrow
nothing from the request pool: a connection kept for the process's life there would be one the
requests can never have. Before, each round hopped to a thread, checked a pooled connection
out (with its liveness query) and back; at concurrency 64 that cost about as much CPU as the
rest of a poll (`bench/gate_api.py`). The price is one more PostgreSQL connection per web
process, counted in the connection budget (`docs/operate/configuration.md`). On SQLite (the
embedded runtime of `manage.py demo`) there is no server to hold a connection to: its rounds
read through Django's connection in one worker thread instead.

A round that cannot read the database answers None, and the poll goes to Django (which
answers from the row, or with the database's error): no copy is used unchecked. The broken
connection is dropped, and the next round connects again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import weakref
from typing import Any

import psycopg
from django.db import DatabaseError, connections

from controlplane.refresh.gate_cache import (
    Committed,
    Scope,
    add_marks,
    collect_revisions,
    committed_revisions,
    marks_query,
    revisions_query,
)

logger = logging.getLogger(__name__)

Found = dict[Scope, Committed] | None

#: Seconds a round may take to connect or read before its polls go to Django.
READ_TIMEOUT_SECONDS = 5.0


def connection_params() -> dict[str, Any]:
    """The default database's connection parameters, as Django's own connections use them
    (host, credentials, `application_name`, prepared statements), for a plain psycopg one."""
    params = connections["default"].get_connection_params()
    for django_only in ("cursor_factory", "context"):
        params.pop(django_only, None)
    return params


class Reader:
    """One loop's connection for revision reads, opened on first use and after a failure."""

    def __init__(self) -> None:
        self.connection: psycopg.AsyncConnection[Any] | None = None

    async def read(self, scopes: frozenset[Scope]) -> Found:
        try:
            return await asyncio.wait_for(self._read(set(scopes)), READ_TIMEOUT_SECONDS)
        except (psycopg.Error, DatabaseError, OSError, TimeoutError):
            logger.warning("gate revisions unreadable; polls go to Django", exc_info=True)
            await self.drop()
            return None

    async def _read(self, wanted: set[Scope]) -> dict[Scope, Committed]:
        if not wanted:
            return {}
        if connections["default"].vendor != "postgresql":
            # SQLite (the embedded runtime, `manage.py demo`): no server to hold a connection
            # to; Django's own connection in a worker thread, closed after each round.
            return await asyncio.get_running_loop().run_in_executor(
                _sqlite_reader, _read_through_django, frozenset(wanted)
            )
        if self.connection is None or self.connection.closed:
            self.connection = await psycopg.AsyncConnection.connect(
                **connection_params(), autocommit=True
            )
        async with self.connection.cursor() as cursor:
            await cursor.execute(*revisions_query(wanted))
            found, missing = collect_revisions(wanted, await cursor.fetchall())
            if missing:
                await cursor.execute(*marks_query(missing))
                add_marks(wanted, found, await cursor.fetchall())
        return found

    def close_now(self) -> None:
        """Close the connection without a loop (its loop was closed and collected)."""
        connection, self.connection = self.connection, None
        if connection is not None:
            with contextlib.suppress(psycopg.Error, OSError):
                connection.pgconn.finish()

    async def drop(self) -> None:
        connection, self.connection = self.connection, None
        if connection is not None:
            with contextlib.suppress(psycopg.Error, OSError):
                await connection.close()


#: One thread reads the embedded runtime's SQLite rounds (rounds never overlap within a loop).
_sqlite_reader = concurrent.futures.ThreadPoolExecutor(
    max_workers=1, thread_name_prefix="gate-revisions"
)


def _read_through_django(scopes: frozenset[Scope]) -> dict[Scope, Committed]:
    try:
        return committed_revisions(scopes)
    finally:
        connections.close_all()


class Rounds:
    """The rounds of one event loop: at most one read running and one gathering polls."""

    def __init__(self) -> None:
        # No reference to the loop: the rounds live exactly as long as their loop does.
        self.reader = Reader()
        self.gathering: set[Scope] = set()
        self.next: asyncio.Future[Found] | None = None
        self.running = False

    async def revision(self, scope: Scope) -> Committed | None:
        loop = asyncio.get_running_loop()
        if self.next is None:
            self.next = loop.create_future()
            self.gathering = set()
        self.gathering.add(scope)
        joined = self.next
        if not self.running:
            # Started on the loop's next turn, not now: every poll this turn reaches joins it.
            self.running = True
            loop.call_soon(self._start)
        found = await asyncio.shield(joined)
        return None if found is None else found.get(scope)

    def _start(self) -> None:
        loop = asyncio.get_running_loop()
        future, scopes = self.next, self.gathering
        assert future is not None
        self.next, self.gathering = None, set()
        job = loop.create_task(read_revisions(self.reader, frozenset(scopes)))

        def done(job: asyncio.Task[Found]) -> None:
            failed = job.cancelled() or job.exception() is not None
            future.set_result(None if failed else job.result())
            if self.next is not None:
                loop.call_soon(self._start)  # the polls that came meanwhile, and this turn's
            else:
                self.running = False

        job.add_done_callback(done)


async def read_revisions(reader: Reader, scopes: frozenset[Scope]) -> Found:
    """One round's read (a module function, so a test can count the rounds)."""
    return await reader.read(scopes)


_rounds: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Rounds] = weakref.WeakKeyDictionary()


async def committed_revision(source: str, namespace: str) -> Committed | None:
    """The gate's revision and its source's policy mark in the database, read after this call
    began; None: unknown (the database could not be read)."""
    loop = asyncio.get_running_loop()
    rounds = _rounds.get(loop)
    if rounds is None:
        close_readers(only_closed_loops=True)
        rounds = _rounds[loop] = Rounds()
    return await rounds.revision((source, namespace))


def close_readers(*, only_closed_loops: bool = False) -> None:
    """Close the reader connections of loops that have ended (all of them, by default).

    A server has one loop for its life; a process that runs many loops one after another (a
    test session, `asyncio.run` per call) would otherwise keep one connection per ended loop:
    each new loop's first poll closes those of the loops before it."""
    for loop in list(_rounds.keys()):
        if not only_closed_loops or loop.is_closed():
            rounds = _rounds.pop(loop, None)
            if rounds is not None:
                rounds.reader.close_now()
