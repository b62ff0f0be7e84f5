"""Long polls that hold no database connection while they wait.

`GET /api/v1/refreshes/<id>/group?wait=N&after=S` answers once the group's handshake state is
no longer `S` (or the refresh stopped executing), or as it is after `N` seconds. It used to be
a sync view polling its pooled connection every 0.2 s: 20 polls from one viewer token took
the whole pool, and every other request of the process (gate reads, lists, `/readyz`) failed
on a pool timeout.

Now the wait is async and costs no connection:

- it waits on a wake-up (`controlplane.realtime.wakeup`): the group and state events the
  refresh already publishes on `refresh.<id>` when the handshake or the refresh moves;
- each wake-up re-reads the refresh with one short query, and the connection goes back to the
  pool right after (`_release_connection`): between reads the poll holds nothing;
- events are best effort (a dropped one would leave a poll asleep until its deadline), so it
  also re-reads every `LONG_POLL_RECHECK_SECONDS` whatever happened;
- it ends at its deadline (`wait`, at most 60 s) with the state as it is then;
- at most `LONG_POLL_MAX_WAITS_PER_PROCESS` waits per process and
  `LONG_POLL_MAX_WAITS_PER_TOKEN` per token (or signed-in user) in a process; past either a
  poll is answered 429 with `Retry-After` at once, before any query. A poll without `wait`
  is a plain read and is never refused.

Django still runs a request in a thread of its own while sync-only middleware (WhiteNoise,
the correlation id, the probes) wraps the chain; a waiting poll parks that thread, holding no
connection, and the per-process cap bounds those threads as well.

The other places a request could wait, and why they are safe as they are:

- the gate API (`gates.get_gate`, ETag and `If-None-Match`): no long poll, a 304 at once. A
  request may wait for another one rebuilding the same gate's copy (`_priming_lock`): one
  short database read, once per gate. Polls answered in front of Django (`fast_gate`) wait
  on asyncio for one grant or copy load per process, in a worker thread.
- token grants (`accounts.tokens.grant_for`): a lapsed grant is loaded by one request per
  token and process while the others wait on a lock: one short read.
- planning a refresh (`POST /refreshes`, operators only): waits at most 0.2 s for another
  discovery's claim on the source (`fleet.discovery.runner.run_discovery`).
- websockets (`realtime.streams.LiveStream`): no polling; events come through the fan-out
  and the resyncs run in one shared database thread (`dbhop.orm_hop`), which gives its
  connection back after each batch.
- pages that poll (the delivery log's htmx refresh): the browser polls; each poll is a
  short request.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter
from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from typing import Any

import redis
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.shortcuts import get_object_or_404

from controlplane.accounts.roles import Perm
from controlplane.intake.api.auth import limit_to_sources, require
from controlplane.realtime.wakeup import process_wakeups
from controlplane.refresh import handshake
from controlplane.refresh.live import EVENT_STATE, refresh_group
from controlplane.refresh.models import PolicyRefresh

logger = logging.getLogger(__name__)

#: The events on `refresh.<id>` after which the group's view may differ (per-call progress
#: and steps do not change it, and would only cost re-reads).
GROUP_EVENTS = frozenset({handshake.EVENT_GROUP, EVENT_STATE})
#: Seconds a refused poll is told to wait: waits end within a minute at most, and a client
#: retrying sooner would be refused again while the same polls are still open.
RETRY_AFTER_SECONDS = 5


class WaitsFull(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class WaitSlots:
    """How many long polls wait in this process, in all and per caller."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # the sync test client runs views on several loops
        self.total = 0
        self.by_caller: Counter[Hashable] = Counter()

    @contextmanager
    def take(self, caller: Hashable) -> Iterator[None]:
        with self._lock:
            if self.total >= settings.LONG_POLL_MAX_WAITS_PER_PROCESS:
                raise WaitsFull("this server has too many long polls waiting; retry later")
            if self.by_caller[caller] >= settings.LONG_POLL_MAX_WAITS_PER_TOKEN:
                raise WaitsFull("this token has too many long polls waiting; retry later")
            self.total += 1
            self.by_caller[caller] += 1
        try:
            yield
        finally:
            with self._lock:
                self.total -= 1
                self.by_caller[caller] -= 1
                if not self.by_caller[caller]:
                    del self.by_caller[caller]


slots = WaitSlots()


def _caller(request: HttpRequest) -> Hashable:
    """Whose polls these are: the token, else the signed-in user (ninja's `request.auth`)."""
    grant = getattr(request, "grant", None)
    if grant is not None:
        return ("token", grant.token_id)
    auth = getattr(request, "auth", None)
    return ("user", getattr(auth, "pk", None))


def _release_connection() -> None:
    """Hand this thread's connection back to the pool now, not when the request ends: a wait
    must hold none. Inside a transaction (tests run in one) closing would only spoil it."""
    if not connection.in_atomic_block:
        connection.close()


def _read(request: HttpRequest, refresh_id: int) -> tuple[dict[str, Any], bool]:
    """The group's public view and whether it will still move: one query, then the connection
    goes back. Checks the permission and the caller's sources on every read."""
    try:
        require(request, Perm.VIEW)
        refreshes = limit_to_sources(request, PolicyRefresh.objects.select_related("source"))
        refresh = get_object_or_404(refreshes, pk=refresh_id)
        return handshake.public_view(refresh), refresh.state in handshake.ENDED
    finally:
        _release_connection()


read_group = sync_to_async(_read)


def _settled(view: dict[str, Any], ended: bool, after: str | None) -> bool:
    return ended or view["state"] != (after or "")


def refused(message: str) -> JsonResponse:
    body = {"error": {"code": "throttled", "message": message, "details": None}}
    response = JsonResponse(body, status=429)
    response["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return response


async def group_long_poll(
    request: HttpRequest, refresh_id: int, wait: float, after: str | None
) -> dict[str, Any] | JsonResponse:
    """The group view, once it is no longer `after` or `wait` seconds have passed."""
    if not wait:
        view, _ = await read_group(request, refresh_id)
        return view
    deadline = time.monotonic() + wait
    try:
        with slots.take(_caller(request)):
            return await _wait(request, refresh_id, after, deadline)
    except WaitsFull as exc:
        return refused(exc.message)


async def _wait(
    request: HttpRequest, refresh_id: int, after: str | None, deadline: float
) -> dict[str, Any]:
    try:
        async with process_wakeups().watch(refresh_group(refresh_id), GROUP_EVENTS) as watch:
            # Read once subscribed: a change made before the subscription is seen here, one
            # made after it wakes the watch.
            view, ended = await read_group(request, refresh_id)
            while not _settled(view, ended, after):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                await watch.wait(min(remaining, settings.LONG_POLL_RECHECK_SECONDS))
                view, ended = await read_group(request, refresh_id)
            return view
    except (redis.RedisError, OSError) as exc:
        # Redis unreachable: no wake-ups, so re-read on the recheck interval alone.
        logger.warning("long poll without wake-ups (%s); re-reading on a timer", exc)
    view, ended = await read_group(request, refresh_id)
    while not _settled(view, ended, after) and time.monotonic() < deadline:
        remaining = deadline - time.monotonic()
        await asyncio.sleep(min(max(remaining, 0.0), settings.LONG_POLL_RECHECK_SECONDS))
        view, ended = await read_group(request, refresh_id)
    return view
