"""Canonical hashing of audit rows and verification of the whole chain."""

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass

GENESIS_HASH = "0" * 64


def canonical_content(event) -> bytes:
    """The bytes an entry hash covers: every column but the hash itself, in a stable form."""
    content = {
        "sequence": event.sequence,
        "occurred_at": event.occurred_at.isoformat(timespec="microseconds"),
        "actor_type": event.actor_type,
        "actor_user_id": event.actor_user_id,
        "actor_label": event.actor_label,
        "source_ip": event.source_ip,
        "action": event.action,
        "target_type": event.target_type,
        "target_id": event.target_id,
        "target_label": event.target_label,
        "details": event.details,
        "correlation_id": event.correlation_id,
        "previous_hash": event.previous_hash,
    }
    return json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def entry_hash(event) -> str:
    return hashlib.sha256(canonical_content(event)).hexdigest()


@dataclass(frozen=True)
class ChainReport:
    ok: bool
    checked: int
    first_bad_sequence: int | None = None
    problem: str | None = None


def verify_chain(events: Iterable, head=None) -> ChainReport:
    """Walk events in sequence order and report the first row that breaks the chain."""
    expected_previous = GENESIS_HASH
    expected_sequence = 1
    checked = 0
    for event in events:
        if event.sequence != expected_sequence:
            return ChainReport(
                False,
                checked,
                event.sequence,
                f"expected row #{expected_sequence} next, found #{event.sequence} "
                "(a row was deleted or reordered)",
            )
        if event.previous_hash != expected_previous:
            return ChainReport(
                False, checked, event.sequence, "previous-hash link does not match the row before"
            )
        if entry_hash(event) != event.entry_hash:
            return ChainReport(
                False, checked, event.sequence, "content does not match its hash (row modified)"
            )
        expected_previous = event.entry_hash
        expected_sequence += 1
        checked += 1
    if head is not None and (
        head.last_sequence != checked or (checked and head.last_hash != expected_previous)
    ):
        return ChainReport(
            False,
            checked,
            checked + 1 if head.last_sequence > checked else head.last_sequence,
            f"chain head records #{head.last_sequence} but the table ends at #{checked} "
            "(rows at the end were deleted)",
        )
    return ChainReport(True, checked)
