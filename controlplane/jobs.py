"""Enqueueing a Celery task by name, after commit, without ever failing the caller.

The database row is the outbox: every task sent from here acts on a row that records what is
still to do (a `queued` webhook delivery, an executing refresh nobody holds, a queued
quarantine, ...), and a beat sweep enqueues again whatever is left undone too long. So a send
that fails — the broker is down or restarting — loses nothing: it is logged and counted, and
the caller carries on with its committed change instead of answering an error for work that
has in fact been accepted.

Sending by name keeps the caller free of the tasks module (and of what that imports). Only
Celery and Django are imported here, so any app may use it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field

from celery import current_app
from django.db import transaction

from controlplane.textlimits import SUMMARY_CHARS

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_failed_sends = 0


@dataclass
class Sends:
    """The sends made while `tracking()` was open: how many the broker refused."""

    failed: list[str] = field(default_factory=list)

    @property
    def all_sent(self) -> bool:
        return not self.failed


_tracking: ContextVar[Sends | None] = ContextVar("controlplane_jobs_tracking", default=None)


def send(
    task_name: str,
    *args: object,
    countdown: float | None = None,
    expires: float | None = None,
) -> bool:
    """Send `task_name(*args)` now. False (logged and counted, never raised) when the broker
    did not take it: the row it acts on stays as it is, and its sweep sends it again.

    `expires` (seconds) drops a task that waited longer than that, for periodic work whose next
    tick would do it again anyway."""
    global _failed_sends
    try:
        current_app.send_task(
            task_name, args=args, countdown=countdown or None, expires=expires or None
        )
    except Exception as exc:
        with _lock:
            _failed_sends += 1
        sends = _tracking.get()
        if sends is not None:
            sends.failed.append(task_name)
        logger.warning(
            "could not enqueue %s%r (%s: %s); its sweep enqueues it again",
            task_name,
            args,
            type(exc).__name__,
            str(exc).splitlines()[0][:SUMMARY_CHARS] if str(exc) else "",
        )
        return False
    return True


def enqueue(
    task_name: str,
    *args: object,
    countdown: float | None = None,
    expires: float | None = None,
) -> None:
    """Send `task_name(*args)` once the current transaction commits (at once outside one).

    Robust: a failed send never reaches the caller, nor stops the other commit callbacks."""
    transaction.on_commit(
        functools.partial(send, task_name, *args, countdown=countdown, expires=expires),
        robust=True,
    )


@contextlib.contextmanager
def tracking() -> Iterator[Sends]:
    """Collect the outcome of the sends made inside (including those run on commit when the
    outermost transaction ends inside), so an answer can say whether its work was queued."""
    sends = Sends()
    token = _tracking.set(sends)
    try:
        yield sends
    finally:
        _tracking.reset(token)


def failed_sends() -> int:
    """Sends the broker refused in this process since it started."""
    return _failed_sends
