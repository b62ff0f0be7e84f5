"""History page benchmark: prints figures, asserts nothing.

    .venv/bin/python bench/history.py [--rows 100000]

Fills the audit log with N hash-chained events (a realistic mix of actions, actors and
targets), then times the history page as a viewer sees it — first page, a filter by action, a
filter by actor text, a deep page — with the SQL query count of each, then `audit verify` over
the whole chain (HMAC-signed rows), a first checkpoint of its head (which verifies everything
before it), and `audit verify --anchors`. Uses a throwaway SQLite database unless DATABASE_URL
is set.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
os.environ.setdefault("CONTROLPLANE_VAR_DIR", tempfile.mkdtemp(prefix="bench-var-"))
if not os.environ.get("DATABASE_URL"):
    os.environ["DATABASE_URL"] = f"sqlite:///{tempfile.mkdtemp(prefix='bench-db-')}/bench.sqlite3"


def fill(rows: int) -> None:
    """Append `rows` events with a valid chain, in bulk (the recorder writes one at a time)."""
    from django.db import transaction
    from django.utils import timezone

    from controlplane.audit.actions import ActorType, AuditAction
    from controlplane.audit.chain import GENESIS_HASH, sign_entry
    from controlplane.audit.keys import hmac_keyring
    from controlplane.audit.models import AuditChainHead, AuditEvent

    actions = list(AuditAction)
    key = hmac_keyring().signing
    start = timezone.now() - timedelta(days=30)
    previous, batch = GENESIS_HASH, []
    with transaction.atomic():
        for seq in range(1, rows + 1):
            event = AuditEvent(
                sequence=seq,
                occurred_at=start + timedelta(seconds=seq * 20),
                actor_type=ActorType.USER if seq % 3 else ActorType.SYSTEM,
                actor_label=f"operator-{seq % 40}" if seq % 3 else "system",
                action=actions[seq % len(actions)],
                target_type="fleet.source",
                target_id=str(seq % 25),
                target_label=f"source-{seq % 25}",
                details={"seq": seq, "workers": seq % 500},
                correlation_id=f"{seq:032x}",
                previous_hash=previous,
            )
            sign_entry(event, key)
            previous = event.entry_hash
            batch.append(event)
            if len(batch) == 5000:
                AuditEvent.objects.bulk_create(batch)
                batch = []
        AuditEvent.objects.bulk_create(batch)
        AuditChainHead.objects.update_or_create(
            pk=1, defaults={"last_sequence": rows, "last_hash": previous}
        )


def timed_get(client, path: str, params: dict) -> tuple[float, int, int]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    best, queries, status = float("inf"), 0, 0
    for _ in range(3):
        with CaptureQueriesContext(connection) as captured:
            t0 = time.perf_counter()
            response = client.get(path, params)
            best = min(best, time.perf_counter() - t0)
        queries, status = len(captured), response.status_code
    return best, queries, status


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    args = parser.parse_args()

    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.test import Client

    from controlplane.accounts.roles import Role
    from controlplane.accounts.services import create_user_with_role

    call_command("migrate", verbosity=0)
    t0 = time.perf_counter()
    fill(args.rows)
    engine = settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]
    print(
        f"history bench: {args.rows} audit events ({engine}), filled in "
        f"{time.perf_counter() - t0:.1f} s"
    )

    viewer = create_user_with_role("bench-viewer", Role.VIEWER, "x", validate=False)
    client = Client()
    client.force_login(viewer)
    cases = [
        ("first page", {}),
        ("filter by action", {"action": "policy_refresh.held"}),
        ("filter by actor text", {"actor": "operator-7"}),
        ("filter by target", {"target": "fleet.source:3"}),
        ("page 1000", {"page": "1000"}),
    ]
    print("\nhistory page (best of 3, Django test client, in-process):")
    for label, params in cases:
        seconds, queries, status = timed_get(client, "/history/", params)
        print(f"  {label:22} {seconds * 1000:7.1f} ms  {queries:2} SQL queries  HTTP {status}")

    from io import StringIO

    def timed_command(*args: str) -> tuple[float, str]:
        out = StringIO()
        t0 = time.perf_counter()
        call_command("audit", *args, stdout=out)
        return time.perf_counter() - t0, out.getvalue().strip().splitlines()[0]

    print()
    seconds, said = timed_command("verify")
    print(f"audit verify:           {seconds:5.2f} s — {said}")
    seconds, said = timed_command("checkpoint")
    print(f"audit checkpoint:       {seconds:5.2f} s — {said} (first one: verifies every row)")
    seconds, said = timed_command("verify", "--anchors", str(settings.AUDIT_ANCHOR_FILE))
    print(f"audit verify --anchors: {seconds:5.2f} s — {said}")


if __name__ == "__main__":
    main()
