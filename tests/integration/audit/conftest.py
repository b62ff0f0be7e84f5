"""An upgraded installation's chain: three legacy (unkeyed) rows from before keying, keyed
rows after, a signed checkpoint of row #9, and two newer rows the checkpoint does not cover."""

from __future__ import annotations

import io
import secrets
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from controlplane.audit.actions import AuditAction
from controlplane.audit.anchors import checkpoint_chain_head
from controlplane.audit.chain import GENESIS_HASH, legacy_hash
from controlplane.audit.keys import AuditKey
from controlplane.audit.models import AuditChainHead, AuditEvent
from controlplane.audit.recorder import Actor, record

LEGACY_ROWS = 3
ANCHORED_ROW = 9


def new_key(key_id: str) -> AuditKey:
    return AuditKey(key_id, secrets.token_urlsafe(32).encode())


@pytest.fixture(autouse=True)
def audit_settings(settings, tmp_path):
    """Fresh keys and a fresh anchor file per test, never the developer's own."""
    settings.AUDIT_HMAC_KEYS = (new_key("k1"),)
    settings.AUDIT_ANCHOR_KEYS = ()
    settings.AUDIT_ANCHOR_FILE = tmp_path / "anchors.jsonl"
    return settings


def write_legacy_rows(count: int) -> None:
    """Rows as the application wrote them before keying: no key id, a plain SHA-256."""
    previous = GENESIS_HASH
    start = timezone.now() - timedelta(days=1)
    for sequence in range(1, count + 1):
        event = AuditEvent(
            sequence=sequence,
            occurred_at=start + timedelta(minutes=sequence),
            actor_type="system",
            actor_label="system",
            action=AuditAction.SOURCE_UPDATED,
            details={"legacy": sequence},
            previous_hash=previous,
        )
        event.entry_hash = previous = legacy_hash(event)
        event.save()
    AuditChainHead.objects.update_or_create(
        pk=1, defaults={"last_sequence": count, "last_hash": previous}
    )


def record_some(count: int, label: str = "operator-1") -> None:
    for n in range(count):
        record(
            AuditAction.SOURCE_UPDATED,
            actor=Actor.system(label),
            target=("fleet.source", n, f"source-{n}"),
            details={"n": n},
        )


@pytest.fixture
def chain(db, audit_settings):
    write_legacy_rows(LEGACY_ROWS)
    record_some(ANCHORED_ROW - LEGACY_ROWS)
    written = checkpoint_chain_head(post=False).written
    assert written is not None and written.sequence == ANCHORED_ROW
    record_some(2)
    return audit_settings.AUDIT_ANCHOR_FILE


def verify(anchors=None) -> tuple[bool, str]:
    """`manage.py audit verify [--anchors FILE]`: (exit status 0?, what it said)."""
    args = ["audit", "verify"] + (["--anchors", str(anchors)] if anchors else [])
    out = io.StringIO()
    try:
        call_command(*args, stdout=out)
    except CommandError as exc:
        assert exc.returncode == 1
        return False, str(exc)
    return True, out.getvalue()
