"""Key rotation, legacy rows, and the checkpoint sink: appended, signed, never rewritten."""

from __future__ import annotations

import json
import os

import pytest
from django.conf import settings

from controlplane.audit.anchors import CHECKPOINT_EVENT, checkpoint_chain_head
from controlplane.audit.models import AuditEvent
from tests.integration.audit.conftest import (
    ANCHORED_ROW,
    new_key,
    record_some,
    verify,
    write_legacy_rows,
)
from tests.integration.audit.tampering import forged_append, sha256_as_legacy

pytestmark = pytest.mark.django_db


def _lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_new_rows_are_keyed_and_legacy_rows_keep_their_hashes(audit_settings):
    write_legacy_rows(3)
    legacy_before = list(AuditEvent.objects.order_by("sequence").values_list("entry_hash"))
    record_some(2)
    events = list(AuditEvent.objects.order_by("sequence"))
    assert [e.key_id for e in events] == ["", "", "", "k1", "k1"]
    assert list(AuditEvent.objects.order_by("sequence").values_list("entry_hash"))[:3] == (
        legacy_before
    )
    ok, said = verify()
    assert ok and "rows #1-#3: legacy" in said and "rows #4-#5: HMAC (k1 x2)" in said


def test_key_rotation_newest_signs_older_verify(audit_settings):
    old, new = audit_settings.AUDIT_HMAC_KEYS[0], new_key("k2")
    record_some(3)
    first = checkpoint_chain_head(post=False).written
    audit_settings.AUDIT_HMAC_KEYS = (new, old)
    record_some(2)
    second = checkpoint_chain_head(post=False).written

    assert [e.key_id for e in AuditEvent.objects.order_by("sequence")] == ["k1"] * 3 + ["k2"] * 2
    assert (first.key_id, second.key_id) == ("k1", "k2")
    ok, said = verify(audit_settings.AUDIT_ANCHOR_FILE)
    assert ok, said
    assert "HMAC (k1 x3, k2 x2)" in said and "2 signed checkpoints verified" in said

    # Retiring the old key too early is reported by name, not as a generic mismatch.
    audit_settings.AUDIT_HMAC_KEYS = (new,)
    ok, said = verify()
    assert not ok and "row #1: signed with key id 'k1', which is not configured" in said


def test_checkpoints_may_use_a_separate_anchor_key(audit_settings):
    audit_settings.AUDIT_ANCHOR_KEYS = (new_key("anchor-1"),)
    record_some(2)
    written = checkpoint_chain_head(post=False).written
    assert written.key_id == "anchor-1"
    assert verify(audit_settings.AUDIT_ANCHOR_FILE)[0]

    audit_settings.AUDIT_ANCHOR_KEYS = ()
    ok, said = verify(audit_settings.AUDIT_ANCHOR_FILE)
    assert not ok and "line 1: signed with key id 'anchor-1', which is not configured" in said


def test_forged_or_edited_checkpoint_lines_are_reported(chain):
    line = _lines(chain)[0]
    with open(chain, "a") as sink:  # a checkpoint claiming a shorter chain, signed by guess
        sink.write(json.dumps(line | {"sequence": 4, "signature": "0" * 64}) + "\n")
    ok, said = verify(chain)
    assert not ok and "line 2: signature does not verify" in said

    chain.write_text(json.dumps(line | {"entry_hash": "f" * 64}) + "\n")
    ok, said = verify(chain)
    assert not ok and "line 1: signature does not verify" in said

    chain.write_text("{not json\n")
    ok, said = verify(chain)
    assert not ok and "line 1: not a JSON object" in said


def test_missing_anchor_file_is_an_error_not_a_pass(chain, tmp_path):
    ok, said = verify(tmp_path / "nowhere.jsonl")
    assert not ok and "cannot read anchors" in said


def test_checkpoint_appends_and_never_rewrites(audit_settings):
    path = audit_settings.AUDIT_ANCHOR_FILE
    record_some(2)
    assert checkpoint_chain_head(post=False).written.sequence == 2
    first_bytes, inode = path.read_bytes(), os.stat(path).st_ino

    assert checkpoint_chain_head(post=False).written is None  # head unchanged: nothing new
    assert path.read_bytes() == first_bytes

    record_some(3)
    assert checkpoint_chain_head(post=False).written.sequence == 5
    grown = path.read_bytes()
    assert grown.startswith(first_bytes) and len(grown) > len(first_bytes)
    assert os.stat(path).st_ino == inode  # appended in place, not replaced by a new file
    assert [c["sequence"] for c in _lines(path)] == [2, 5]
    assert _lines(path)[1]["keyed_from"] == 1
    assert set(_lines(path)[1]) == {
        "sequence",
        "entry_hash",
        "time",
        "key_id",
        "keyed_from",
        "signature",
    }
    assert verify(path)[0]


def test_checkpoint_refuses_to_vouch_for_a_tampered_chain(chain):
    before = chain.read_bytes()
    forged_append(sha256_as_legacy)()
    outcome = checkpoint_chain_head(post=False)
    assert outcome.written is None and outcome.reason.startswith("refused: row #12")
    assert chain.read_bytes() == before


def test_checkpoint_refuses_when_the_anchored_row_changed(chain):
    from tests.integration.audit.tampering import TAMPERINGS

    truncate = next(t for t in TAMPERINGS if "application appends again" in t.name)
    truncate.tamper()
    outcome = checkpoint_chain_head(post=False)
    assert outcome.reason == f"refused: row #{ANCHORED_ROW} no longer matches the last checkpoint"


def test_checkpoint_is_posted_only_to_destinations_that_subscribe(audit_settings):
    from controlplane.notify.models import NotificationDelivery, NotificationDestination

    common = {"kind": "webhook", "url": "https://hooks.example/x", "allowed_networks": []}
    wanted = NotificationDestination.objects.create(
        name="anchors", events=[CHECKPOINT_EVENT], **common
    )
    NotificationDestination.objects.create(name="everything", events=[], **common)
    NotificationDestination.objects.create(
        name="off", events=[CHECKPOINT_EVENT], enabled=False, **common
    )
    record_some(2)
    written = checkpoint_chain_head().written

    deliveries = list(NotificationDelivery.objects.all())
    assert [d.destination_id for d in deliveries] == [wanted.pk]
    assert deliveries[0].event == "audit.checkpoint"
    assert deliveries[0].payload["data"]["checkpoint"] == json.loads(written.line())


def test_audit_checkpoint_is_a_subscribable_notification_event():
    from controlplane.notify.services import SUBSCRIBABLE

    assert CHECKPOINT_EVENT in SUBSCRIBABLE


def test_beat_schedules_the_checkpoint_task():
    from controlplane.audit.tasks import checkpoint_chain_head_task

    entry = settings.CELERY_BEAT_SCHEDULE["audit-checkpoint"]
    assert entry["task"] == checkpoint_chain_head_task.name
    assert entry["schedule"].total_seconds() == settings.AUDIT_CHECKPOINT_SECONDS


def test_history_page_names_each_rows_key(audit_settings, client):
    from controlplane.accounts.roles import Role
    from controlplane.accounts.services import create_user_with_role

    write_legacy_rows(1)
    client.force_login(create_user_with_role("auditor", Role.VIEWER, "x", validate=False))
    page = client.get("/history/").content.decode()
    assert 'title="HMAC, key k1"' in page and 'title="legacy row, unkeyed SHA-256"' in page
