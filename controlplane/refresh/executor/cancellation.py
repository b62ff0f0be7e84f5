"""Cancelling a step's calls in flight when the refresh is aborted, and saying how far each got.

An abort used to stop a step only at the next call boundary: a call in flight ran to its reply
or its timeout (30 s with a hung worker) while the page said "updating". Now the journal's
abort watch (`journal.run_step_calls`) calls `InFlight.cancel`, which cancels every call task
on the run's event loop; each comes back as a cancelled `CallRecord`.

What a cancelled call had done to its worker is told by aiohttp's request tracing
(`REQUEST_TRACING`, installed on the run's client): `CallProgress.connected` once a connection
to the worker was made or taken from the pool, `CallProgress.sent` once aiohttp handed the first
bytes of the request (its headers) to that connection. aiohttp runs the trace hook and the
write with no suspension point between them, so a cancellation cannot fall between the two:

- not sent — no byte of the request left this process: the worker cannot have seen it;
- sent ("reached the worker") — the request was written to the connection. The worker may have
  received all of it and acted on it (an update may be applied, or still being applied), or
  not all of it arrived before the connection closed. Nobody can tell from here, so a reached
  call is reported as "may have acted", never as "applied" or "not applied".

A generation check's request goes to the frontend rather than to a worker; "reached" then means
the frontend.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import aiohttp

__all__ = ["REQUEST_TRACING", "CallProgress", "InFlight", "cancelled_error", "track"]


@dataclass(slots=True)
class CallProgress:
    """How far one call got (set by the request tracing, read when it is cancelled)."""

    connected: bool = False
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


async def _connected(_session: Any, _ctx: SimpleNamespace, _params: Any) -> None:
    progress = _CURRENT.get()
    if progress is not None:
        progress.connected = True


async def _sent(_session: Any, _ctx: SimpleNamespace, _params: Any) -> None:
    progress = _CURRENT.get()
    if progress is not None:
        progress.connected = progress.sent = True


def _request_tracing() -> aiohttp.TraceConfig:
    config = aiohttp.TraceConfig()
    config.on_connection_create_end.append(_connected)
    config.on_connection_reuseconn.append(_connected)
    config.on_request_headers_sent.append(_sent)
    config.on_request_chunk_sent.append(_sent)
    config.freeze()
    return config


#: Installed on every client the executor makes (`calls.CallRuntime`, `calls.run_jobs`).
REQUEST_TRACING = _request_tracing()


def cancelled_error(progress: CallProgress) -> str:
    """The journal's error for a call an abort cancelled, saying what the worker may have seen."""
    if progress.sent:
        return (
            "cancelled by an abort after the request reached the worker (it may have acted on it)"
        )
    if progress.connected:
        return (
            "cancelled by an abort with the connection open, before any of the request was "
            "sent (the worker did not receive it)"
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
