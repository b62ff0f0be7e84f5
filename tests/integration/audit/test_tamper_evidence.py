"""Someone who can write the database but does not hold the key cannot change the audit chain
unnoticed: keyed hashes catch rewrites and forged rows, signed checkpoints kept outside the
database catch deleted newest rows and whole-chain rewrites."""

from __future__ import annotations

import pytest

from controlplane.audit.models import AuditChainHead, AuditEvent
from tests.integration.audit.conftest import ANCHORED_ROW, LEGACY_ROWS, verify
from tests.integration.audit.tampering import (
    TAMPERINGS,
    Tampering,
    rehash_from,
    rows,
    set_head,
    sha256_as_legacy,
    sql,
)

pytestmark = pytest.mark.django_db


def test_untouched_chain_verifies_and_says_where_keying_starts(chain):
    ok, said = verify()
    assert ok, said
    assert "audit chain intact: 11 rows verified" in said
    assert f"rows #1-#{LEGACY_ROWS}: legacy, unkeyed SHA-256" in said
    assert f"rows #{LEGACY_ROWS + 1}-#11: HMAC (k1 x8)" in said
    assert "pass --anchors FILE" in said

    ok, said = verify(chain)
    assert ok, said
    assert f"1 signed checkpoints verified, 1 rows pinned; newest names #{ANCHORED_ROW}" in said
    assert "2 newer rows rest on the key alone" in said


@pytest.mark.parametrize("tampering", TAMPERINGS, ids=str)
def test_tampering_is_detected(chain, tampering: Tampering):
    tampering.tamper()

    ok, said = verify(chain)
    assert not ok, f"{tampering} went unnoticed with anchors: {said}"
    assert said.startswith("audit chain broken at row #")

    ok, said = verify()
    assert ok is not tampering.detectable_without_anchors, said


def test_figure_tamperings_detected(chain, capsys):
    """Every tampering on a fresh copy of the chain; prints the figure."""
    snapshot = list(AuditEvent.objects.order_by("sequence").values())
    head = _head()
    with_anchors = without_anchors = 0
    for tampering in TAMPERINGS:
        tampering.tamper()
        with_anchors += not verify(chain)[0]
        without_anchors += not verify()[0]
        _restore(snapshot, head)
        assert verify(chain)[0], f"restoring after {tampering} failed"
    with capsys.disabled():
        print(
            f"\naudit tamper-evidence: {len(TAMPERINGS)} tamperings tried, {with_anchors} "
            f"detected with anchors, {without_anchors} detected without anchors"
        )
    assert with_anchors == len(TAMPERINGS)
    assert without_anchors == sum(t.detectable_without_anchors for t in TAMPERINGS)


def test_rows_after_the_newest_checkpoint_rest_on_the_key(chain):
    """The window between checkpoints: rewriting the newer rows without the key is caught;
    deleting only rows no checkpoint names yet is the one change that passes
    (docs/concepts/security.md)."""
    events = rows()
    events[-1].actor_label = "mallory"
    rehash_from(events, len(events) - 1, sha256_as_legacy)
    ok, said = verify(chain)
    assert not ok and "row #11: unkeyed row after keyed rows began" in said

    sql("DELETE FROM audit_auditevent WHERE sequence > %s", [ANCHORED_ROW])
    set_head(rows())
    assert verify(chain)[0]


def _head():
    return AuditChainHead.objects.values("last_sequence", "last_hash").get(pk=1)


def _restore(snapshot, head) -> None:
    sql("DELETE FROM audit_auditevent")
    AuditEvent.objects.bulk_create(AuditEvent(**row) for row in snapshot)
    AuditChainHead.objects.filter(pk=1).update(**head)
