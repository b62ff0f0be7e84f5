"""The History page's chain status: incremental verification from the last known-good row,
capped per read, that reports where the chain breaks and never vouches past a break."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from controlplane.audit.actions import AuditAction
from controlplane.audit.chain_status import chain_status
from controlplane.audit.recorder import Actor, record
from tests.integration.audit.conftest import LEGACY_ROWS, record_some, write_legacy_rows
from tests.integration.audit.tampering import (
    forged_append,
    guessed_key,
    rewrite_row_then,
    sha256_as_legacy,
    sql,
    truncate_tail,
)

pytestmark = pytest.mark.django_db


def test_an_empty_log_says_so():
    status = chain_status()
    assert status.state == "empty" and status.verified_to == 0


def test_verifies_legacy_and_keyed_rows_up_to_the_head():
    write_legacy_rows(LEGACY_ROWS)
    record_some(5)
    status = chain_status()
    assert (status.state, status.verified_to, status.head) == ("verified", 8, 8)
    assert status.verified_at is not None and status.unchecked == 0


def test_each_read_checks_only_the_rows_added_since():
    record_some(6)
    assert chain_status().verified_to == 6
    record_some(2)
    with CaptureQueriesContext(connection) as queries:
        status = chain_status()
    assert status.state == "verified" and status.verified_to == 8
    walk = [q["sql"] for q in queries.captured_queries if '"sequence" >=' in q["sql"]]
    assert len(walk) == 1 and '"sequence" >= 6 ' in walk[0]  # from row #6 on, not #1


def test_a_capped_read_says_how_far_it_got_and_the_next_goes_on():
    record_some(7)
    first = chain_status(batch=3)
    assert (first.state, first.verified_to, first.unchecked) == ("partial", 3, 4)
    second = chain_status(batch=3)
    assert (second.state, second.verified_to) == ("partial", 6)
    assert chain_status(batch=3).state == "verified"


def test_a_forged_row_after_the_mark_is_reported_where_it_is():
    record_some(4)
    assert chain_status().state == "verified"
    forged_append(guessed_key("k1"))()
    status = chain_status()
    assert status.state == "broken" and status.broken_at == 5
    assert "HMAC" in status.problem
    assert status.verified_to == 4  # what was verified before still stands
    # A break never advances the mark, however often the page is read.
    record(AuditAction.SOURCE_UPDATED, actor=Actor.system("later"))
    assert chain_status().broken_at == 5


def test_a_rewrite_of_the_known_good_row_is_seen_at_once():
    record_some(6)
    assert chain_status().verified_to == 6
    sql("UPDATE audit_auditevent SET entry_hash = %s WHERE sequence = 6", ["0" * 64])
    status = chain_status()
    assert status.state == "broken" and status.broken_at == 6
    assert "no longer has the hash" in status.problem


def test_rows_deleted_at_the_end_are_reported():
    record_some(10)
    assert chain_status().verified_to == 10
    truncate_tail()()  # rows #9 and #10 gone, head reset to #8
    status = chain_status()
    assert status.state == "broken"
    assert "no longer has the hash" in status.problem or "deleted" in status.problem


def test_a_rewrite_before_the_first_read_is_found_by_it():
    record_some(8)
    rewrite_row_then(guessed_key("k1"))()
    status = chain_status()
    assert status.state == "broken" and status.broken_at == 5 and status.verified_to == 0


def test_history_page_shows_where_the_chain_is_verified(viewer_client):
    record_some(3)
    head = chain_status().head
    html = viewer_client.get("/history/").content.decode()
    assert 'id="chain-status"' in html and 'data-state="verified"' in html
    assert f"up to entry #{head} (the newest)" in html
    # Paging and filtering (htmx) swap the table alone and verify nothing.
    with CaptureQueriesContext(connection) as queries:
        partial = viewer_client.get("/history/?page=1", headers={"HX-Request": "true"})
    assert 'id="chain-status"' not in partial.content.decode()
    assert not [q for q in queries.captured_queries if "audit_auditchainhead" in q["sql"]]


def test_history_page_names_the_broken_entry(viewer_client):
    record_some(4)
    forged_append(guessed_key("k1"))()
    html = viewer_client.get("/history/").content.decode()
    assert 'data-state="broken"' in html
    assert "Chain broken at entry #" in html and "HMAC" in html


def test_a_recreated_database_is_verified_afresh_not_called_tampered():
    """The mark outlives the database in the cache (a dropped and recreated database of the
    same name): another row #1 means another chain, verified from its start."""
    record_some(6)
    assert chain_status().verified_to == 6
    sql("DELETE FROM audit_auditevent")
    sql("UPDATE audit_auditchainhead SET last_sequence = 0, last_hash = %s", ["0" * 64])
    record_some(3, label="a new installation")
    status = chain_status()
    assert (status.state, status.verified_to) == ("verified", 3)


@pytest.mark.parametrize(
    "hasher", [guessed_key("k1"), sha256_as_legacy], ids=["guessed key", "as legacy rows"]
)
def test_a_full_rewrite_without_the_key_is_still_broken(hasher):
    """Rewritten from row #1 on: another chain to the mark, verified from its start, where
    the HMACs fail, or unkeyed rows stand where keyed rows began."""
    record_some(6)
    assert chain_status().verified_to == 6
    rewrite_row_then(hasher, from_start=True)()
    status = chain_status()
    assert status.state == "broken" and status.broken_at == 1
