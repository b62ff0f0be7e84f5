"""Canonical hashing of audit rows and verification of the whole chain.

A row's `entry_hash` is HMAC-SHA256(key, canonical content) where the content includes the
previous row's hash and the signing key's id. Rows written before keying have a blank key id
and a plain SHA-256; they verify as "legacy" and may only form a prefix of the chain: an
unkeyed row after a keyed one is a forgery, since the application never writes one.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from controlplane.audit.keys import AuditKey, Keyring, hmac_keyring

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
    if event.key_id:  # legacy rows were hashed without it; keyed rows also cover their key id
        content["key_id"] = event.key_id
    return json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def legacy_hash(event) -> str:
    """The unkeyed SHA-256 of rows written before keying."""
    return hashlib.sha256(canonical_content(event)).hexdigest()


def keyed_hash(event, secret: bytes) -> str:
    return hmac.digest(secret, canonical_content(event), "sha256").hex()


def sign_entry(event, key: AuditKey) -> None:
    """Set the row's key id and its HMAC (the key id is part of what is signed)."""
    event.key_id = key.id
    event.entry_hash = keyed_hash(event, key.secret)


class Pin(Protocol):
    """One signed checkpoint, as verification reads it (see anchors.Checkpoint)."""

    @property
    def entry_hash(self) -> str: ...

    @property
    def time(self) -> str: ...


class Pins(Protocol):
    """What verification needs from a set of signed checkpoints (see anchors.AnchorSet)."""

    @property
    def by_sequence(self) -> Mapping[int, Pin]: ...

    @property
    def keyed_from(self) -> int | None: ...


@dataclass(frozen=True)
class ChainReport:
    ok: bool
    checked: int
    first_bad_sequence: int | None = None
    problem: str | None = None
    last_sequence: int = 0
    last_hash: str = GENESIS_HASH
    legacy_rows: int = 0
    keyed_from: int | None = None
    key_ids: dict[str, int] = field(default_factory=dict)
    anchors_matched: int = 0


def verify_chain(
    events: Iterable,
    head=None,
    *,
    keyring: Keyring | None = None,
    anchors: Pins | None = None,
    after: tuple[int, str] | None = None,
) -> ChainReport:
    """Walk events in sequence order and report the first row that breaks the chain.

    `anchors` are signed checkpoints from outside the database: each pins the hash of one row,
    and the earliest says where keying started. `after=(sequence, hash)` verifies only the rows
    after a row already known good (the checkpoint task does that between checkpoints).
    """
    if keyring is None:
        keyring = hmac_keyring()
    pins = anchors.by_sequence if anchors is not None else {}
    pinned_keyed_from = anchors.keyed_from if anchors is not None else None
    expected_sequence, expected_previous = (after[0] + 1, after[1]) if after else (1, GENESIS_HASH)
    checked = legacy = matched = 0
    keyed_from = None
    key_ids: Counter[str] = Counter()
    secret_for = keyring.secret

    def broken(sequence: int, problem: str) -> ChainReport:
        return ChainReport(
            False,
            checked,
            sequence,
            problem,
            expected_sequence - 1,
            expected_previous,
            legacy,
            keyed_from,
            dict(key_ids),
            matched,
        )

    for event in events:
        sequence = event.sequence
        if sequence != expected_sequence:
            return broken(
                sequence,
                f"expected row #{expected_sequence} next, found #{sequence} "
                "(a row was deleted or reordered)",
            )
        if event.previous_hash != expected_previous:
            return broken(sequence, "previous-hash link does not match the row before")
        key_id = event.key_id
        if key_id:
            secret = secret_for(key_id)
            if secret is None:
                return broken(
                    sequence,
                    f"signed with key id {key_id!r}, which is not configured "
                    "(a forged row, or a key missing from AUDIT_HMAC_KEY)",
                )
            if keyed_from is None:
                keyed_from = sequence
            if not hmac.compare_digest(keyed_hash(event, secret), event.entry_hash):
                return broken(
                    sequence,
                    "content does not match its HMAC (row modified or signed without the key)",
                )
            key_ids[key_id] += 1
        else:
            if keyed_from is not None:
                return broken(
                    sequence,
                    f"unkeyed row after keyed rows began at #{keyed_from} "
                    "(forged or rewritten without the key)",
                )
            if pinned_keyed_from is not None and sequence >= pinned_keyed_from:
                return broken(
                    sequence,
                    f"unkeyed row, but a signed checkpoint says keyed rows begin at "
                    f"#{pinned_keyed_from} (rewritten without the key)",
                )
            if legacy_hash(event) != event.entry_hash:
                return broken(sequence, "content does not match its hash (row modified)")
            legacy += 1
        pin = pins.get(sequence)
        if pin is not None:
            if pin.entry_hash != event.entry_hash:
                return broken(
                    sequence,
                    f"hash differs from the signed checkpoint of {pin.time} "
                    "(row rewritten, or the chain was truncated and regrown)",
                )
            matched += 1
        expected_previous = event.entry_hash
        expected_sequence += 1
        checked += 1

    last = expected_sequence - 1
    beyond = [s for s in pins if s > last]
    if beyond:
        pin = pins[min(beyond)]
        return broken(
            last + 1,
            f"the signed checkpoint of {pin.time} names row #{min(beyond)}, but the chain ends "
            f"at #{last} (rows at the end were deleted)",
        )
    if head is not None and (
        head.last_sequence != last or (last and head.last_hash != expected_previous)
    ):
        return broken(
            last + 1 if head.last_sequence > last else head.last_sequence,
            f"chain head records #{head.last_sequence} but the table ends at #{last} "
            "(rows at the end were deleted)",
        )
    return ChainReport(
        True,
        checked,
        None,
        None,
        last,
        expected_previous,
        legacy,
        keyed_from,
        dict(key_ids),
        matched,
    )
