"""The one order in which transactions take row locks, and a check that enforces it.

Lock order (a transaction may skip levels, never go back up):

1. fleet rows: a source's workers, then the `fleet.Source` row (only discovery and source
   edits lock them; the discovery claim is its own short transaction);
2. `refresh.PolicyRefresh` rows, lowest id first (`select_for_update`, the executor's lease);
3. `refresh.ScopeLock` rows of one source, namespaces in sorted order (insert or delete);
4. `refresh.Gate` rows of one source, namespaces in sorted order;
5. intake rows: webhook endpoints, received webhooks, idempotency keys, notification rows;
6. `audit.AuditChainHead` — always last.

Why the chain head goes last: every audited change bumps that one row (see
`audit/recorder.py`), so it is the only lock every writer shares. Taken last, it is held only
for the few statements that append the audit rows and commit, and no transaction ever waits for
a domain row while holding it — which is what closed the cycle behind the webhook deadlocks
(one transaction held the head and wanted a scope lock or gate another held while that other
waited for the head). Taking it first instead would serialise every audited transaction over
its whole length.

After `record()` a transaction may still append more audit rows and insert rows nobody else can
be waiting for (notification deliveries, the new audit event), but it must not update, delete
or `select_for_update` existing domain rows, nor insert into a contended unique index (scope
locks, gates). `domain_lock()` at those lock sites raises `LockOrderViolation` when the chain
head is already held (or logs it, with `LOCK_ORDER_STRICT` off in production).
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import transaction

logger = logging.getLogger(__name__)


class LockOrderViolation(RuntimeError):
    """A transaction tried to lock a domain row after it took the audit chain head."""


def _chain_head_taken() -> None:
    """A marker in the connection's on-commit list; it has nothing to do at commit."""


def note_chain_head_taken(using: str | None = None) -> None:
    """Called by the audit recorder once it holds the chain head in the caller's transaction."""
    connection = transaction.get_connection(using)
    if not connection.in_atomic_block:
        return  # autocommit: the head was released with the recorder's own transaction
    if all(getattr(block, "_from_testcase", False) for block in connection.atomic_blocks):
        return  # only a test case's wrapper: in production this was autocommit too
    # Registered in the caller's savepoint: it vanishes when that savepoint rolls back (which
    # releases the lock too) and at commit.
    transaction.on_commit(_chain_head_taken, using=using)


def chain_head_held(using: str | None = None) -> bool:
    connection = transaction.get_connection(using)
    if not connection.in_atomic_block:
        return False
    current = set(connection.savepoint_ids)
    return any(
        func is _chain_head_taken and sids <= current for sids, func, _ in connection.run_on_commit
    )


def domain_lock(what: str, using: str | None = None) -> None:
    """Declare that the caller is about to lock `what` (a domain row): the head must not be held."""
    if not chain_head_held(using):
        return
    message = f"lock order: {what} locked after the audit chain head (controlplane/lockorder.py)"
    if getattr(settings, "LOCK_ORDER_STRICT", True):
        raise LockOrderViolation(message)
    logger.error(message)
