"""Streaming export of audit rows as JSON lines or CSV, shared by the command and the web view."""

import csv
import io
import json
from collections.abc import Iterable, Iterator

FIELDS = [
    "sequence",
    "occurred_at",
    "actor_type",
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
]


def _row(event) -> dict:
    return {
        "sequence": event.sequence,
        "occurred_at": event.occurred_at.isoformat(),
        "actor_type": event.actor_type,
        "actor_label": event.actor_label,
        "source_ip": event.source_ip,
        "action": event.action,
        "target_type": event.target_type,
        "target_id": event.target_id,
        "target_label": event.target_label,
        "details": event.details,
        "correlation_id": event.correlation_id,
        "previous_hash": event.previous_hash,
        "entry_hash": event.entry_hash,
        "key_id": event.key_id,
    }


def export_jsonl(events: Iterable) -> Iterator[str]:
    for event in events:
        yield json.dumps(_row(event), sort_keys=True) + "\n"


def export_csv(events: Iterable) -> Iterator[str]:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=FIELDS)
    writer.writeheader()
    for event in events:
        row = _row(event)
        row["details"] = json.dumps(row["details"], sort_keys=True)
        writer.writerow(row)
        yield buffer.getvalue()
        buffer.seek(0)
        buffer.truncate()
    if buffer.getvalue():
        yield buffer.getvalue()


EXPORTERS = {"jsonl": export_jsonl, "csv": export_csv}
