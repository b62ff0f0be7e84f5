"""Upgrading keeps history as written: rows hashed before keying verify as legacy rows."""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from controlplane.audit.models import AuditEvent
from tests.integration.audit.conftest import record_some, verify

BEFORE_KEYING = ("audit", "0002_action_without_choices")


def _hash_as_released(row: dict) -> str:
    """The entry hash exactly as the release before keying computed it."""
    content = dict(row, occurred_at=row["occurred_at"].isoformat(timespec="microseconds"))
    del content["entry_hash"]
    return hashlib.sha256(
        json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    ).hexdigest()


def _insert_old_rows(count: int) -> list[str]:
    previous, hashes = "0" * 64, []
    start = timezone.now() - timedelta(days=3)
    with connection.cursor() as cursor:
        for sequence in range(1, count + 1):
            row = {
                "sequence": sequence,
                "occurred_at": start + timedelta(seconds=sequence),
                "actor_type": "user",
                "actor_user_id": None,
                "actor_label": f"operator-{sequence}",
                "source_ip": "10.0.0.7",
                "action": "source.updated",
                "target_type": "fleet.source",
                "target_id": "3",
                "target_label": "prod-a",
                "details": {"interval": sequence, "note": "ünïcode"},
                "correlation_id": f"{sequence:032x}",
                "previous_hash": previous,
            }
            row["entry_hash"] = previous = _hash_as_released(row | {"entry_hash": ""})
            columns = ", ".join(row)
            cursor.execute(
                f"INSERT INTO audit_auditevent ({columns}) VALUES ({', '.join(['%s'] * len(row))})",
                [json.dumps(v) if isinstance(v, dict) else v for v in row.values()],
            )
            hashes.append(previous)
        cursor.execute(
            "INSERT INTO audit_auditchainhead (id, last_sequence, last_hash) VALUES (1, %s, %s)",
            [count, previous],
        )
    return hashes


@pytest.mark.django_db(transaction=True)
def test_migration_keeps_old_hashes_and_they_verify_as_legacy(audit_settings):
    executor = MigrationExecutor(connection)
    latest = executor.loader.graph.leaf_nodes("audit")
    executor.migrate([BEFORE_KEYING])
    try:
        old_hashes = _insert_old_rows(5)
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(latest)

    kept = list(AuditEvent.objects.order_by("sequence").values_list("entry_hash", "key_id"))
    assert kept == [(h, "") for h in old_hashes]
    record_some(2)
    ok, said = verify()
    assert ok, said
    assert "rows #1-#5: legacy, unkeyed SHA-256" in said and "rows #6-#7: HMAC (k1 x2)" in said
