"""Signed checkpoints of the chain head, kept outside the database.

Keyed hashes stop anyone without the key from rewriting or appending rows, but not from
deleting the newest rows and resetting the head: what remains is still a valid chain. A
checkpoint is a signed statement "at <time> row #<sequence> had hash <entry_hash>, and keyed
rows began at #<keyed_from>", appended as one JSON line to `AUDIT_ANCHOR_FILE` (and announced
with the `checkpoint_appended` signal, which `controlplane.notify` turns into deliveries to the
destinations that subscribe to `audit.checkpoint`). `audit verify --anchors FILE`
then detects truncation (a checkpoint names a row that no longer exists), rewriting (a
checkpointed row's hash changed) and rows downgraded to unkeyed legacy hashes.

The file is only ever opened with O_APPEND and fsynced after each line; for the guarantee to
hold it must live where the database's attackers cannot rewrite it (another host, a mount
with `chattr +a`, object storage with retention, or the notification receiver's own log).
"""

from __future__ import annotations

import hmac
import json
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from django.conf import settings
from django.dispatch import Signal
from django.utils import timezone

from controlplane.audit.chain import ChainReport, verify_chain
from controlplane.audit.keys import AuditKey, Keyring, anchor_keyring
from controlplane.audit.models import AuditEvent

logger = logging.getLogger(__name__)

CHECKPOINT_EVENT = "audit.checkpoint"
#: Sent with `checkpoint=<Checkpoint>` after a checkpoint is appended (unless `post=False`).
#: A signal, not a call: `notify` records its own audit rows, so audit must not import it.
checkpoint_appended = Signal()
_SIGNING_CONTEXT = b"audit-checkpoint:v1\n"  # never confusable with a row's HMAC input
_TAIL_BYTES = 16 * 1024
#: The columns verification reads; rows as named tuples are much cheaper than model instances.
VERIFY_FIELDS = (
    "sequence",
    "occurred_at",
    "actor_type",
    "actor_user_id",
    "actor_label",
    "source_ip",
    "action",
    "target_type",
    "target_id",
    "target_label",
    "details",
    "correlation_id",
    "previous_hash",
    "entry_hash",
    "key_id",
)


class AnchorError(ValueError):
    """An anchor line that is malformed, unsigned by a configured key, or forged."""


@dataclass(frozen=True)
class Checkpoint:
    sequence: int
    entry_hash: str
    time: str
    key_id: str
    keyed_from: int | None
    signature: str = ""

    def signed_fields(self) -> dict:
        fields = asdict(self)
        del fields["signature"]
        return fields

    def message(self) -> bytes:
        body = json.dumps(self.signed_fields(), sort_keys=True, separators=(",", ":"))
        return _SIGNING_CONTEXT + body.encode()

    def line(self) -> bytes:
        return (json.dumps(asdict(self), sort_keys=True, separators=(",", ":")) + "\n").encode()


def sign_checkpoint(
    sequence: int, entry_hash: str, keyed_from: int | None, key: AuditKey, *, time=None
) -> Checkpoint:
    unsigned = Checkpoint(
        sequence=sequence,
        entry_hash=entry_hash,
        time=(time or timezone.now()).isoformat(timespec="microseconds"),
        key_id=key.id,
        keyed_from=keyed_from,
    )
    signature = hmac.digest(key.secret, unsigned.message(), "sha256").hex()
    return Checkpoint(**unsigned.signed_fields(), signature=signature)


def parse_checkpoint(line: str, keyring: Keyring) -> Checkpoint:
    """One anchor line → a checkpoint whose signature verifies, or AnchorError saying why."""
    try:
        raw = json.loads(line)
    except ValueError:
        raise AnchorError("not a JSON object") from None
    if not isinstance(raw, dict) or set(raw) != {f for f in Checkpoint.__dataclass_fields__}:
        raise AnchorError("not a checkpoint (wrong fields)")
    sequence, keyed_from = raw["sequence"], raw["keyed_from"]
    if not isinstance(sequence, int) or isinstance(sequence, bool) or sequence < 1:
        raise AnchorError("sequence must be a positive integer")
    if keyed_from is not None and (
        not isinstance(keyed_from, int) or isinstance(keyed_from, bool) or keyed_from < 1
    ):
        raise AnchorError("keyed_from must be a positive integer or null")
    if not all(isinstance(raw[k], str) for k in ("entry_hash", "time", "key_id", "signature")):
        raise AnchorError("entry_hash, time, key_id and signature must be strings")
    checkpoint = Checkpoint(**raw)
    secret = keyring.secret(checkpoint.key_id)
    if secret is None:
        raise AnchorError(f"signed with key id {checkpoint.key_id!r}, which is not configured")
    expected = hmac.digest(secret, checkpoint.message(), "sha256").hex()
    if not hmac.compare_digest(expected, checkpoint.signature):
        raise AnchorError("signature does not verify (forged or altered checkpoint)")
    return checkpoint


@dataclass
class AnchorSet:
    """Every checkpoint of an anchor file, indexed the way verification uses them."""

    by_sequence: dict[int, Checkpoint] = field(default_factory=dict)
    keyed_from: int | None = None
    newest: Checkpoint | None = None
    count: int = 0


def load_anchors(path: Path, keyring: Keyring | None = None) -> AnchorSet:
    """Read and verify every line. Raises AnchorError naming the first bad line: a line that
    does not verify means someone wrote to the sink, which is itself a finding."""
    keyring = keyring or anchor_keyring()
    anchors = AnchorSet()
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                checkpoint = parse_checkpoint(line, keyring)
            except AnchorError as exc:
                raise AnchorError(f"{path} line {number}: {exc}") from None
            known = anchors.by_sequence.get(checkpoint.sequence)
            if known is not None and known.entry_hash != checkpoint.entry_hash:
                raise AnchorError(
                    f"{path} line {number}: checkpoints of {known.time} and {checkpoint.time} "
                    f"give row #{checkpoint.sequence} different hashes (the chain was truncated "
                    "and regrown between them)"
                )
            anchors.by_sequence.setdefault(checkpoint.sequence, checkpoint)
            if checkpoint.keyed_from is not None:
                anchors.keyed_from = min(
                    anchors.keyed_from or checkpoint.keyed_from, checkpoint.keyed_from
                )
            if anchors.newest is None or checkpoint.sequence >= anchors.newest.sequence:
                anchors.newest = checkpoint
            anchors.count += 1
    return anchors


def last_checkpoint(path: Path, keyring: Keyring) -> Checkpoint | None:
    """The newest line of the file that verifies, reading only the file's tail."""
    try:
        with open(path, "rb") as file:
            file.seek(0, os.SEEK_END)
            size = file.tell()
            file.seek(max(0, size - _TAIL_BYTES))
            tail = file.read().decode("utf-8", "replace").splitlines()
    except FileNotFoundError:
        return None
    if size > _TAIL_BYTES:
        tail = tail[1:]  # the first line read is probably cut
    for line in reversed(tail):
        try:
            return parse_checkpoint(line, keyring)
        except AnchorError:
            continue
    return None


def append_checkpoint(path: Path, checkpoint: Checkpoint) -> None:
    """Append one line: O_APPEND (never seek, never truncate), one write, then fsync."""
    path.parent.mkdir(parents=True, exist_ok=True)
    created = not path.exists()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
    try:
        data = checkpoint.line()
        while data:
            data = data[os.write(fd, data) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    if created:  # make the new directory entry durable too
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def verification_rows(queryset=None):
    queryset = queryset if queryset is not None else AuditEvent.objects.all()
    return (
        queryset.order_by("sequence")
        .values_list(*VERIFY_FIELDS, named=True)
        .iterator(chunk_size=5000)
    )


@dataclass(frozen=True)
class CheckpointOutcome:
    written: Checkpoint | None
    reason: str


def checkpoint_chain_head(path: Path | None = None, *, post: bool = True) -> CheckpointOutcome:
    """Verify the rows since the last checkpoint, then append a checkpoint of the head.

    A checkpoint vouches for everything before it, so it is written only when the rows since
    the previous one verify (links, HMACs, and that the previous checkpoint's row is unchanged);
    otherwise nothing is written and the problem is logged. An unchanged head writes nothing.
    """
    path = Path(path or settings.AUDIT_ANCHOR_FILE)
    keyring = anchor_keyring()
    previous = last_checkpoint(path, keyring)
    rows = AuditEvent.objects.all()
    after = None
    pins = AnchorSet()
    if previous is not None:
        pinned = AuditEvent.objects.filter(sequence=previous.sequence).first()
        if pinned is None or pinned.entry_hash != previous.entry_hash:
            return _refuse(f"row #{previous.sequence} no longer matches the last checkpoint")
        rows = rows.filter(sequence__gt=previous.sequence)
        after = (previous.sequence, previous.entry_hash)
        pins.keyed_from = previous.keyed_from
    report: ChainReport = verify_chain(verification_rows(rows), anchors=pins, after=after)
    if not report.ok:
        return _refuse(f"row #{report.first_bad_sequence}: {report.problem}")
    if report.last_sequence == 0:
        return CheckpointOutcome(None, "the audit log is empty")
    if previous is not None and report.last_sequence == previous.sequence:
        return CheckpointOutcome(None, f"head unchanged at #{previous.sequence}")
    keyed_from = previous.keyed_from if previous and previous.keyed_from else report.keyed_from
    checkpoint = sign_checkpoint(
        report.last_sequence, report.last_hash, keyed_from, keyring.signing
    )
    append_checkpoint(path, checkpoint)
    if post:
        post_checkpoint(checkpoint)
    return CheckpointOutcome(checkpoint, f"checkpoint of #{checkpoint.sequence} appended")


def _refuse(problem: str) -> CheckpointOutcome:
    logger.error("audit checkpoint refused, the chain does not verify: %s", problem)
    return CheckpointOutcome(None, f"refused: {problem}")


def post_checkpoint(checkpoint: Checkpoint) -> int:
    """Announce the checkpoint to whoever forwards it (the notify app's destinations that
    subscribe to `audit.checkpoint`). Returns how many deliveries were queued. Never raises:
    the file is the primary sink."""
    replies = checkpoint_appended.send_robust(sender=Checkpoint, checkpoint=checkpoint)
    queued = 0
    for receiver, reply in replies:
        if isinstance(reply, Exception):
            logger.error(
                "audit checkpoint #%s could not be posted by %r: %s",
                checkpoint.sequence,
                receiver,
                reply,
                exc_info=reply,
            )
        elif isinstance(reply, int):
            queued += reply
    return queued
