"""What an attacker with write access to the database, but not the key, can do to the chain.

Each tampering edits rows with raw SQL (as a database user would, around the application's
append-only guards) and leaves the chain head consistent with what it wrote, so nothing but the
hashes, the keys and the anchors can give it away.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass

from django.db import connection

from controlplane.audit.actions import AuditAction
from controlplane.audit.chain import GENESIS_HASH, legacy_hash, sign_entry
from controlplane.audit.keys import AuditKey
from controlplane.audit.models import AuditEvent
from controlplane.audit.recorder import Actor, record

Hasher = Callable[[AuditEvent], None]


def sql(statement: str, params=()) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


def rows() -> list[AuditEvent]:
    return list(AuditEvent.objects.order_by("sequence"))


def set_head(events: list[AuditEvent]) -> None:
    last = events[-1] if events else None
    sql(
        "UPDATE audit_auditchainhead SET last_sequence = %s, last_hash = %s WHERE id = 1",
        [last.sequence if last else 0, last.entry_hash if last else GENESIS_HASH],
    )


def write_back(event: AuditEvent) -> None:
    sql(
        "UPDATE audit_auditevent SET sequence = %s, actor_label = %s, previous_hash = %s, "
        "entry_hash = %s, key_id = %s WHERE id = %s",
        [
            event.sequence,
            event.actor_label,
            event.previous_hash,
            event.entry_hash,
            event.key_id,
            event.pk,
        ],
    )


def rehash_from(events: list[AuditEvent], index: int, hasher: Hasher) -> None:
    """Recompute links and hashes from events[index] to the end, write them, reset the head."""
    previous = events[index - 1].entry_hash if index else GENESIS_HASH
    for event in events[index:]:
        event.previous_hash = previous
        hasher(event)
        previous = event.entry_hash
        write_back(event)
    set_head(events)


# How the attacker recomputes a hash.
def sha256_keeping_key_id(event: AuditEvent) -> None:
    event.entry_hash = legacy_hash(event)


def sha256_as_legacy(event: AuditEvent) -> None:
    event.key_id = ""
    event.entry_hash = legacy_hash(event)


def guessed_key(key_id: str) -> Hasher:
    guess = AuditKey(key_id, secrets.token_urlsafe(32).encode())
    return lambda event: sign_entry(event, guess)


# The tamperings. Each takes the untouched chain (see build_chain) and changes it.
def rewrite_row_then(hasher: Hasher, *, from_start: bool = False):
    def tamper() -> None:
        events = rows()
        target = next(i for i, e in enumerate(events) if e.sequence == 5)
        events[target].actor_label = "mallory"
        rehash_from(events, 0 if from_start else target, hasher)

    return tamper


def truncate_tail(*, regrow: bool = False):
    def tamper() -> None:
        sql("DELETE FROM audit_auditevent WHERE sequence >= 9")
        set_head(rows())
        if regrow:  # the application carries on from the reset head, signing new rows
            record(AuditAction.SOURCE_UPDATED, actor=Actor.system("innocent"))
            record(AuditAction.SOURCE_UPDATED, actor=Actor.system("innocent"))

    return tamper


def forged_append(hasher: Hasher):
    def tamper() -> None:
        events = rows()
        last = events[-1]
        forged = AuditEvent(
            sequence=last.sequence + 1,
            occurred_at=last.occurred_at,
            actor_type="system",
            actor_label="system",
            action=AuditAction.GATE_FORCE_REOPENED,
            details={"reason": "looks routine"},
            previous_hash=last.entry_hash,
        )
        hasher(forged)
        forged.save()
        set_head(rows())

    return tamper


def delete_middle_row_then(hasher: Hasher, *, from_start: bool = False):
    def tamper() -> None:
        sql("DELETE FROM audit_auditevent WHERE sequence = 6")
        events = rows()
        for event in events:
            if event.sequence > 6:
                event.sequence -= 1
        start = next(i for i, e in enumerate(events) if e.sequence == 6)
        rehash_from(events, 0 if from_start else start, hasher)

    return tamper


@dataclass(frozen=True)
class Tampering:
    name: str
    tamper: Callable[[], None]
    detectable_without_anchors: bool

    def __str__(self) -> str:
        return self.name


TAMPERINGS = [
    Tampering(
        "rewrite a row, recompute SHA-256 hashes from it on",
        rewrite_row_then(sha256_keeping_key_id),
        True,
    ),
    Tampering(
        "rewrite a row, recompute the whole chain as unkeyed SHA-256",
        rewrite_row_then(sha256_as_legacy, from_start=True),
        False,
    ),
    Tampering(
        "rewrite a row, recompute from it on with a guessed key",
        rewrite_row_then(guessed_key("k1")),
        True,
    ),
    Tampering(
        "rewrite a row, recompute the whole chain with a guessed key under a new id",
        rewrite_row_then(guessed_key("k9"), from_start=True),
        True,
    ),
    Tampering("delete the newest rows and reset the head", truncate_tail(), False),
    Tampering(
        "delete the newest rows, reset the head, the application appends again",
        truncate_tail(regrow=True),
        False,
    ),
    Tampering("append a forged row hashed with SHA-256", forged_append(sha256_as_legacy), True),
    Tampering("append a forged row with a guessed key", forged_append(guessed_key("k1")), True),
    Tampering(
        "delete a middle row, renumber, recompute with a guessed key",
        delete_middle_row_then(guessed_key("k1")),
        True,
    ),
    Tampering(
        "delete a middle row, renumber, recompute the whole chain as unkeyed SHA-256",
        delete_middle_row_then(sha256_as_legacy, from_start=True),
        False,
    ),
]
