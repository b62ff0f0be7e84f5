"""Cancelling a step's calls in flight when the refresh is aborted, and saying how far each got.

An abort used to stop a step only at the next call boundary: a call in flight ran to its reply
or its timeout (30 s with a hung worker) while the page said "updating". Now the journal's
abort watch (`journal.run_step_calls`) calls `InFlight.cancel`, which cancels every call task
on the run's event loop; each comes back as a cancelled `CallRecord`.

What a cancelled call had done to its worker is told by the run's request class
(`TrackedRequest`, installed on the run's client): `CallProgress.sent` is set when aiohttp hands
the request to a connection it holds (`ClientRequest.send`, entered once the connection is made
or taken from the pool). From there to the headers and body reaching the socket aiohttp makes
no suspension point (it buffers the headers and writes them with the body in the same turn of
the loop), so a cancellation cannot fall between the mark and the write. (Only a connection
whose send buffer is full makes it wait first; such a call counts as reached: the safe side.)

- not sent — no byte of the request left this process: the worker cannot have seen it;
- sent ("reached the worker") — the request was written to the connection. The worker may have
  received all of it and acted on it (an update may be applied, or still being applied), or
  not all of it arrived before the connection closed. Nobody can tell from here, so a reached
  call is reported as "may have acted", never as "applied" or "not applied".

A generation check's request goes to the frontend rather than to a worker; "reached" then means
the frontend.

Why a request class and not aiohttp's request tracing: a session with a trace config awaits
every trace signal of every request (request start and end, connection, headers, each chunk
sent and received): about a tenth of the call thread's CPU in a refresh of 500 workers, for an
answer one method override gives (docs/decisions/2026-12-06-policy-refresh-cost.md).
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from dataclasses import dataclass

import aiohttp
from aiohttp.connector import Connection

__all__ = ["CallProgress", "InFlight", "TrackedRequest", "cancelled_error", "track"]


@dataclass(slots=True)
class CallProgress:
    """How far one call got (set by `TrackedRequest`, read when it is cancelled)."""

    sent: bool = False


#: The call the running task is making (set in the call's own task, so its context is its own).
_CURRENT: contextvars.ContextVar[CallProgress | None] = contextvars.ContextVar(
    "refresh_call_progress", default=None
)


def track() -> CallProgress:
    """Start tracking the call made by the current task; returns its progress."""
    progress = CallProgress()
    _CURRENT.set(progress)
    return progress


class TrackedRequest(aiohttp.ClientRequest):
    """aiohttp's request, marking the tracked call sent as it is handed to its connection."""

    async def send(self, conn: Connection) -> aiohttp.ClientResponse:
        progress = _CURRENT.get()
        if progress is not None:
            progress.sent = True
        return await super().send(conn)


def cancelled_error(progress: CallProgress) -> str:
    """The journal's error for a call an abort cancelled, saying what the worker may have seen."""
    if progress.sent:
        return (
            "cancelled by an abort after the request reached the worker (it may have acted on it)"
        )
    return "cancelled by an abort before the request was sent (the worker did not receive it)"


class InFlight:
    """The call tasks of one step on the run's event loop, so an abort can cancel them.

    Tasks are added and removed on the loop; `cancel` may be called from any thread. A call
    that has not started when `cancel` is asked never starts: the caller sets the step's `stop`
    event first, which every call looks at before it starts, in the same turn of the loop in
    which it would register — so no call slips between the two.
    """

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self.cancelled = False

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._lock:
            self._loop = loop
            cancelled = self.cancelled
        if cancelled:
            loop.call_soon(self._cancel_all)

    def add(self, task: asyncio.Task) -> None:
        self._tasks.add(task)

    def discard(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)

    def cancel(self) -> None:
        """Cancel every call in flight (from any thread; idempotent)."""
        with self._lock:
            if self.cancelled:
                return
            self.cancelled = True
            loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._cancel_all)

    def _cancel_all(self) -> None:
        for task in list(self._tasks):
            task.cancel()
