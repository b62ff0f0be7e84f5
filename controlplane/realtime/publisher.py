"""One long-lived publisher per process: fire-and-forget live events from sync code.

`publish` used to run `async_to_sync(layer.group_send)` on the caller's thread: a new event loop
and a new Redis connection per call, 1-3 s of wall per policy refresh, and a refresh stalled
whenever Redis was slow. Now the caller only appends to a bounded queue; a daemon thread owns
one event loop and one channel layer (so one Redis connection pool) and sends in order.

Guarantees, in order of importance:

- The caller never blocks on Redis and never sees an exception: a full queue, Redis down or a
  slow send drops frames (logged, counted). Live pages resync from the database on (re)connect
  and on every state change, so a lost frame costs freshness, never correctness.
- Order is kept: events leave in the order they were published. A coalescible event (one with
  a `coalesce_key`, e.g. per-call progress of one refresh) is held back to at most
  `COALESCE_PER_SECOND` frames per key, the newest replacing the one waiting; before any plain
  event (a state change, a terminal event) goes out, every progress frame waiting is sent
  first, so progress never arrives after the state change that followed it.
- Frames queued when the process ends are sent: `flush` runs at exit and when a Celery worker
  (or one of its prefork children) shuts down, within `FLUSH_TIMEOUT_SECONDS`.
- Fork-safe: a forked child (Celery prefork, gunicorn-style servers) starts a publisher of its
  own on its first publish; what the parent had queued stays the parent's to send.
"""

from __future__ import annotations

import asyncio
import atexit
import itertools
import logging
import os
import threading
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from celery import signals as celery_signals
from channels.layers import DEFAULT_CHANNEL_LAYER, channel_layers

logger = logging.getLogger(__name__)

#: Frames waiting to be sent; past this a publish is dropped (Redis down or far too slow).
MAX_PENDING = 10_000
#: At most this many frames per second for one coalesce key ("a few per second").
COALESCE_PER_SECOND = 4.0
#: One send that takes longer is abandoned (Redis hanging, not refusing).
SEND_TIMEOUT_SECONDS = 3.0
#: A frame that waited this long behind failures is stale: pages have resynced since.
STALE_AFTER_SECONDS = 10.0
#: How long exit (and a Celery worker's shutdown) waits for queued frames.
FLUSH_TIMEOUT_SECONDS = 5.0
#: Failures are logged at most this often, with the count dropped in between.
LOG_EVERY_SECONDS = 10.0


@dataclass(slots=True)
class Frame:
    """One published event on its way to a group."""

    group: str
    message: dict[str, Any]
    coalesce_key: Hashable | None
    queued_at: float


class Publisher:
    """A daemon thread with one event loop and one channel layer, sending frames in order.

    Thread-safe: `submit` and `flush` may be called from any thread but the publisher's own.
    """

    def __init__(
        self,
        *,
        max_pending: int = MAX_PENDING,
        coalesce_per_second: float = COALESCE_PER_SECOND,
        send_timeout: float = SEND_TIMEOUT_SECONDS,
        stale_after: float = STALE_AFTER_SECONDS,
    ) -> None:
        self.max_pending = max_pending
        self.coalesce_interval = 1.0 / coalesce_per_second
        self.send_timeout = send_timeout
        self.stale_after = stale_after
        self.sent = 0
        self.dropped = 0
        self._pending = 0  # submitted and not yet sent, coalesced away or dropped
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        # Owned by the loop thread from here on.
        self._outbox: deque[Frame] = deque()
        self._held: OrderedDict[Hashable, Frame] = OrderedDict()
        self._last_sent: dict[Hashable, float] = {}
        self._timers: dict[Hashable, asyncio.TimerHandle] = {}
        self._wakeup: asyncio.Event | None = None
        self._idle: asyncio.Event | None = None
        self._layer: Any = None
        self._stats_lock = threading.Lock()
        self._last_log = 0.0
        self._unlogged_drops = 0

    # -- any thread -----------------------------------------------------------------------

    def submit(self, group: str, message: dict[str, Any], coalesce_key: Hashable | None) -> bool:
        """Queue one frame; False (and nothing else) when it had to be dropped."""
        with self._lock:
            if self._closed:
                return False
            full = self._pending >= self.max_pending
            if not full:
                loop = self._running_loop()
                self._pending += 1
        if full:
            self._note_drop("the live-event queue is full")
            return False
        frame = Frame(group, message, coalesce_key, time.monotonic())
        try:
            loop.call_soon_threadsafe(self._accept, frame)
        except RuntimeError:  # the loop closed under us (interpreter exit)
            with self._lock:
                self._pending -= 1
            return False
        return True

    def flush(self, timeout: float = FLUSH_TIMEOUT_SECONDS) -> bool:
        """Send every queued frame, held progress included; True when all went out in time."""
        loop = self._loop
        if loop is None or not loop.is_running():
            return self._pending == 0
        if threading.current_thread() is self._thread:
            return False  # would wait on itself
        future = asyncio.run_coroutine_threadsafe(self._drain(), loop)
        try:
            future.result(timeout)
        except Exception:  # TimeoutError, or the loop stopped meanwhile
            future.cancel()
            return False
        return True

    def close(self, timeout: float = FLUSH_TIMEOUT_SECONDS) -> bool:
        """Flush, then stop the thread and close the layer's connections. Later publishes drop."""
        delivered = self.flush(timeout)
        with self._lock:
            self._closed = True
            loop, thread = self._loop, self._thread
        if loop is not None and loop.is_running():
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop)
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        return delivered

    @property
    def pending(self) -> int:
        return self._pending

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        """The publisher's loop, starting its thread on first use (called under the lock)."""
        if self._loop is None:
            loop = asyncio.new_event_loop()
            started = threading.Event()
            thread = threading.Thread(
                target=self._run, args=(loop, started), name="live-publisher", daemon=True
            )
            thread.start()
            started.wait()
            self._loop, self._thread = loop, thread
        return self._loop

    def _note_drop(self, why: str, exc: BaseException | None = None) -> None:
        with self._stats_lock:
            self.dropped += 1
            self._unlogged_drops += 1
            now = time.monotonic()
            if now - self._last_log < LOG_EVERY_SECONDS:
                return
            count, self._last_log, self._unlogged_drops = self._unlogged_drops, now, 0
        logger.warning(
            "%s: %d live event(s) dropped since the last warning (pages resync from the database)",
            why,
            count,
            exc_info=exc,
        )

    # -- the publisher's thread -----------------------------------------------------------

    def _run(self, loop: asyncio.AbstractEventLoop, started: threading.Event) -> None:
        asyncio.set_event_loop(loop)
        self._wakeup = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        loop.call_soon(started.set)
        sender = loop.create_task(self._send_forever())
        try:
            loop.run_forever()
        finally:
            sender.cancel()
            loop.run_until_complete(asyncio.gather(sender, return_exceptions=True))
            loop.close()  # channels' layers close their Redis pools with the loop

    def _accept(self, frame: Frame) -> None:
        key = frame.coalesce_key
        if key is None:
            self._release_all()  # progress published before a state change goes before it
            self._enqueue(frame)
            return
        waiting = self._held.get(key)
        if waiting is not None:
            # Last value wins; its place in the order is the first one's.
            waiting.message, waiting.group = frame.message, frame.group
            waiting.queued_at = frame.queued_at
            self._settle(1)
            return
        due = self._last_sent.get(key, float("-inf")) + self.coalesce_interval
        now = time.monotonic()
        if now >= due:
            self._last_sent[key] = now
            self._enqueue(frame)
            return
        self._held[key] = frame
        assert self._loop is not None
        self._timers[key] = self._loop.call_later(due - now, self._release, key)

    def _release(self, key: Hashable) -> None:
        self._timers.pop(key, None)
        frame = self._held.pop(key, None)
        if frame is not None:
            self._last_sent[key] = time.monotonic()
            self._enqueue(frame)

    def _release_all(self) -> None:
        for key in list(self._held):
            timer = self._timers.pop(key, None)
            if timer is not None:
                timer.cancel()
            self._release(key)
        if len(self._last_sent) > 1000:  # forget keys (refreshes) that went quiet
            horizon = time.monotonic() - self.coalesce_interval
            self._last_sent = {k: t for k, t in self._last_sent.items() if t > horizon}

    def _enqueue(self, frame: Frame) -> None:
        assert self._wakeup is not None and self._idle is not None
        self._outbox.append(frame)
        self._idle.clear()
        self._wakeup.set()

    def _settle(self, count: int) -> None:
        with self._lock:
            self._pending -= count

    async def _send_forever(self) -> None:
        assert self._wakeup is not None and self._idle is not None
        while True:
            if not self._outbox:
                if not self._held:
                    self._idle.set()
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            frame = self._outbox.popleft()
            try:
                await self._send(frame)
            finally:
                self._settle(1)

    async def _send(self, frame: Frame) -> None:
        if time.monotonic() - frame.queued_at > self.stale_after:
            self._note_drop("live events went stale behind failed sends")
            return
        try:
            if self._layer is None:
                self._layer = channel_layers.make_backend(DEFAULT_CHANNEL_LAYER)
            await asyncio.wait_for(
                self._layer.group_send(frame.group, frame.message), self.send_timeout
            )
        except Exception as exc:
            self._note_drop(f"live event to {frame.group} not delivered", exc)
        else:
            self.sent += 1

    async def _drain(self) -> None:
        assert self._idle is not None
        self._release_all()
        await self._idle.wait()

    async def _shutdown(self) -> None:
        layer, self._layer = self._layer, None
        if layer is not None and hasattr(layer, "flush"):
            try:
                await layer.flush()  # close this loop's Redis connections cleanly
            except Exception:
                logger.debug("closing the live publisher's channel layer failed", exc_info=True)
        asyncio.get_running_loop().stop()


# -- the process's publisher ----------------------------------------------------------------

_publisher: Publisher | None = None
_publisher_lock = threading.Lock()
#: Publishers inherited through fork(): their thread did not survive it, and letting them be
#: garbage-collected could close sockets the parent still uses. Kept, never touched.
_inherited: list[Publisher] = []
_ids = itertools.count(1)
_process_tag = uuid.uuid4().hex[:12]


def process_publisher() -> Publisher:
    """This process's publisher, started on first use (again in a forked child)."""
    global _publisher
    current = _publisher
    if current is not None:
        return current
    with _publisher_lock:
        if _publisher is None:
            _publisher = Publisher()
        return _publisher


def next_event_id() -> str:
    """Unique per published event across processes and hosts: consumers cache shared renders
    by it, so two publishers must never hand out the same one."""
    return f"{_process_tag}.{next(_ids)}"


def _after_fork_in_child() -> None:
    global _publisher, _publisher_lock, _process_tag
    if _publisher is not None:
        _inherited.append(_publisher)
    _publisher = None
    _publisher_lock = threading.Lock()  # the parent may have held it while forking
    _process_tag = uuid.uuid4().hex[:12]


def flush_at_exit(*_args: Any, **_kwargs: Any) -> None:
    """Send what is queued before the process ends (atexit, Celery worker shutdown)."""
    current = _publisher
    if current is not None and current.pending and not current.flush(FLUSH_TIMEOUT_SECONDS):
        logger.warning("%d live event(s) not sent before exit", current.pending)


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(flush_at_exit)
# Celery's prefork children leave through os._exit, past atexit: flush on their own signal.
celery_signals.worker_process_shutdown.connect(flush_at_exit, weak=False)
celery_signals.worker_shutdown.connect(flush_at_exit, weak=False)
