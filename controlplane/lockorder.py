"""The one order in which transactions take row locks, and a check that enforces it.

Lock order (a transaction may skip levels, never go back up):

1. fleet rows: a source's workers, then the `fleet.Source` row (only discovery and source
   edits lock them; the discovery claim is its own short transaction);
2. `refresh.PolicyRefresh` rows, lowest id first (`_locked`, the executor's lease);
3. `refresh.ScopeLock` rows of one source, namespaces in sorted order (insert or delete);
4. `refresh.Gate` rows of one source, namespaces in sorted order;
5. intake rows: webhook endpoints, received webhooks, idempotency keys, notification rows;
6. `audit.AuditChainHead` — always last.

Why the chain head goes last: every audited change bumps that one row (see
`audit/recorder.py`), so it is the only lock every writer shares. Taken last, it is held only
for the few statements that append the audit rows and commit, and no transaction ever waits for
a domain row while holding it. Taking it first instead would serialise every audited
transaction over its whole length.

Foreign keys are checked at COMMIT (Django creates them DEFERRABLE INITIALLY DEFERRED), so an
insert takes `FOR KEY SHARE` on the rows it references *after* the chain head. A domain row
locked with plain `FOR UPDATE` blocks those checks — which is how 50 concurrent starts
deadlocked: a start held its refresh *and source* rows `FOR UPDATE` (`select_related` locks
every joined table) while waiting for the head, and a plan holding the head could not commit
its new refresh, whose source check waited for that start. So domain rows are locked
`FOR NO KEY UPDATE` and only their own table: `select_for_update(no_key=True, of=("self",))`.

After `record()` a transaction may still append more audit rows and insert rows nobody else can
be waiting for (notification deliveries, the new audit event), but it must not update, delete
or `select_for_update` existing domain rows, nor insert into a contended unique index (scope
locks, gates). `domain_lock()` at those lock sites raises `LockOrderViolation` when the chain
head is already held; the check runs in development and CI (`LOCK_ORDER_STRICT`, PostgreSQL).
"""

from __future__ import annotations

from django.conf import settings
from django.db import transaction


class LockOrderViolation(RuntimeError):
    """A transaction tried to lock a domain row after it took the audit chain head."""


# The check costs a query per audit row and lock site, so it runs where LOCK_ORDER_STRICT is on
# (development and CI), on PostgreSQL (SQLite locks the whole database: no order to keep).
def _enabled(connection) -> bool:
    return bool(getattr(settings, "LOCK_ORDER_STRICT", False)) and connection.vendor == "postgresql"


def _transaction_id(connection) -> str | None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_current_xact_id_if_assigned()::text")
        return cursor.fetchone()[0]


def _own_block(connection) -> tuple[int, str | None] | None:
    """The caller's outermost atomic block (skipping a test case's wrappers): its index and
    savepoint id, which tell one of the caller's transactions from the next inside a test."""
    for index, block in enumerate(connection.atomic_blocks):
        if not getattr(block, "_from_testcase", False):
            return index, connection.savepoint_ids[index - 1] if index else None
    return None


def note_chain_head_taken(using: str | None = None) -> None:
    """Called by the audit recorder once it holds the chain head in the caller's transaction."""
    connection = transaction.get_connection(using)
    if not _enabled(connection) or not connection.in_atomic_block:
        return  # autocommit: the head was released with the recorder's own transaction
    own = _own_block(connection)
    if own is None:
        return  # only a test case's wrapper: in production this was autocommit too
    connection.lockorder_chain_head = (_transaction_id(connection), *own)


def chain_head_held(using: str | None = None) -> bool:
    connection = transaction.get_connection(using)
    marker = getattr(connection, "lockorder_chain_head", None)
    if marker is None or not connection.in_atomic_block or not _enabled(connection):
        return False
    xid, index, sid = marker
    if index >= len(connection.atomic_blocks):
        return False
    if index and (
        len(connection.savepoint_ids) < index or connection.savepoint_ids[index - 1] != sid
    ):
        return False
    return _transaction_id(connection) == xid


def domain_lock(what: str, using: str | None = None) -> None:
    """Declare that the caller is about to lock `what` (a domain row): the head must not be held."""
    if chain_head_held(using):
        raise LockOrderViolation(
            f"lock order: {what} locked after the audit chain head (controlplane/lockorder.py)"
        )
