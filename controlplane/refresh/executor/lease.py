"""The executor's lease on a refresh, with a fencing token.

Claiming moves `lease_token` from the value it read to the next with a conditional UPDATE
that only matches when nobody holds a live lease and nobody claimed since the read. Every
later write runs `guard()` first, in the same transaction: an UPDATE that matches only while
the token is still ours. A stale executor (one whose lease expired and was
taken over) matches nothing and its whole transaction — journal rows included — is rolled back.

The lease remembers when this process last renewed it (`renewed_at`: the monotonic clock read
before the statement, so it never flatters the lease, and recorded once the renewal commits, so
a rolled-back one does not count): the journal's heartbeat renews only when `renewal_due()`,
not at every beat.

An abort moves the refresh to `aborting` under the refresh's row lock, while the executor may be
about to move it on (the next step, held, succeeded). So a guard that changes the state matches
only while the refresh is not `aborting`, unless it is the executor's confirmation of the abort
(`CONFIRMS_ABORT`); a guard refused for that reason raises `AbortPending` and its transaction
rolls back whole, and the runner confirms the abort instead.

Through a database outage the renewals fail and are retried (`controlplane.dbretry`), so an
outage longer than the lease may let another executor take the refresh over once the database
answers. Nothing is lost silently: this executor's next guard then finds the token stale and
raises `LeaseLost`, and the retried transaction it was in writes nothing.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db import connections, router, transaction
from django.db.models import Q
from django.utils import timezone

from controlplane import dbretry
from controlplane.refresh.models import EXECUTING_STATES, PolicyRefresh, RefreshState
from controlplane.textlimits import LABEL_CHARS


class LeaseLost(Exception):
    """Another executor took the refresh over; this one must stop writing at once."""


class AbortPending(Exception):
    """A person aborted the refresh (it is `aborting`): the state change this executor was
    writing did not apply, and it must confirm the abort instead."""


#: The states an executor may move an `aborting` refresh to: its confirmation of the abort.
CONFIRMS_ABORT = frozenset({RefreshState.ABORTED, RefreshState.RELEASING})


def default_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"


@dataclass
class Lease:
    refresh_id: int
    token: int
    owner: str
    seconds: float
    #: The previous holder never released: this claim is a takeover after a crash.
    takeover: bool = False
    #: `time.monotonic()` when this process last renewed the lease (claim or guard).
    renewed_at: float = field(default_factory=time.monotonic)

    @classmethod
    def claim(cls, refresh_id: int, owner: str | None = None) -> Lease | None:
        """The refresh's lease, if nobody holds a live one; None otherwise. Rides out a
        transient database failure (`dbretry`), outside a transaction.

        A compare-and-set on the token read first: the claim moves `lease_token` from the
        value it read to the next. So when a try's UPDATE reached the server but its answer
        was lost with the connection, the retry can tell its own claim (that next token, this
        owner, live) from another executor's, and takes the lease it already holds instead of
        answering "not claimed", which would leave the refresh with a live lease and nobody
        running it until the lease lapsed."""
        owner = (owner or default_owner())[:LABEL_CHARS]
        seconds = settings.REFRESH_LEASE_SECONDS
        read: tuple[int, str] | None = None  # (token, owner) before the claim: the first try's
        tries = 0

        def attempt() -> Lease | None:
            nonlocal read, tries
            tries += 1
            renewed_at = time.monotonic()
            if read is None:
                row = (
                    PolicyRefresh.objects.filter(pk=refresh_id)
                    .values_list("lease_token", "lease_owner")
                    .first()
                )
                if row is None:
                    return None
                read = row
            token, previous = read
            now = timezone.now()
            claimed = (
                PolicyRefresh.objects.filter(
                    pk=refresh_id, state__in=EXECUTING_STATES, lease_token=token
                )
                .filter(Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now))
                .update(
                    lease_token=token + 1,
                    lease_owner=owner,
                    lease_expires_at=now + timedelta(seconds=seconds),
                )
            )
            landed_before = (
                not claimed
                and tries > 1
                and PolicyRefresh.objects.filter(
                    pk=refresh_id,
                    lease_token=token + 1,
                    lease_owner=owner,
                    lease_expires_at__gt=now,
                ).exists()
            )
            if not (claimed or landed_before):
                return None
            return cls(
                refresh_id,
                token + 1,
                owner,
                seconds,
                takeover=bool(previous),
                renewed_at=renewed_at,
            )

        return dbretry.retry(attempt, what="claiming the lease")

    def guard(self, **fields) -> None:
        """Renew the lease and apply `fields`, only if the token is still ours.

        Call inside `transaction.atomic()` before the writes it protects.
        """
        renewed_at = time.monotonic()
        fields.setdefault("lease_expires_at", timezone.now() + timedelta(seconds=self.seconds))
        ours = PolicyRefresh.objects.filter(pk=self.refresh_id, lease_token=self.token)
        moving = "state" in fields and fields["state"] not in CONFIRMS_ABORT
        if moving:
            ours = ours.exclude(state=RefreshState.ABORTING)
        matched = ours.update(**fields)
        if not matched:
            if (
                moving
                and PolicyRefresh.objects.filter(
                    pk=self.refresh_id, lease_token=self.token, state=RefreshState.ABORTING
                ).exists()
            ):
                raise AbortPending(f"policy refresh #{self.refresh_id} is aborting")
            raise LeaseLost(
                f"policy refresh #{self.refresh_id}: fencing token {self.token} is stale"
            )
        if fields["lease_expires_at"] is not None:  # a release gives the lease up
            self._renewed(renewed_at)

    def guard_reading_abort(self) -> bool:
        """`guard()` that also returns the refresh's abort flag, read by the same statement
        (`UPDATE … RETURNING`): each journal flush needs both, and was a statement more."""
        opts = PolicyRefresh._meta
        connection = connections[router.db_for_write(PolicyRefresh)]
        qn = connection.ops.quote_name
        renewed_at = time.monotonic()
        expires = timezone.now() + timedelta(seconds=self.seconds)
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {qn(opts.db_table)} SET {qn('lease_expires_at')} = %s "
                f"WHERE {qn('id')} = %s AND {qn('lease_token')} = %s "
                f"RETURNING {qn('abort_requested')}",
                [connection.ops.adapt_datetimefield_value(expires), self.refresh_id, self.token],
            )
            row = cursor.fetchone()
        if row is None:
            raise LeaseLost(
                f"policy refresh #{self.refresh_id}: fencing token {self.token} is stale"
            )
        self._renewed(renewed_at)
        return bool(row[0])

    def _renewed(self, at: float) -> None:
        # Run at once outside a transaction; dropped if the transaction rolls back.
        transaction.on_commit(lambda: setattr(self, "renewed_at", max(self.renewed_at, at)))

    def renewal_due(self, fraction: float) -> bool:
        """True once `fraction` of the lease has passed since this process last renewed it."""
        return time.monotonic() - self.renewed_at >= self.seconds * fraction

    def release(self, **fields) -> None:
        """Give the refresh up cleanly (held, finished): the reconciler will leave it alone."""
        self.guard(lease_owner="", lease_expires_at=None, **fields)
