"""Real reply shapes for the trainer library's guard tests: capture, compare, store.

The library's unit tests (clients/python/tests) read the stored fixtures; the tests here and in
tests/interop capture a fresh reply from the simulated fleet's frontend and from the real
Dynamo 1.6.1 frontend, check the stored fixture still has the live reply's shape, and rewrite
it with `UPDATE_REPLY_FIXTURES=1`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from dynamo_rl_trainer import Completion

FIXTURES = Path(__file__).resolve().parents[3] / "clients" / "python" / "tests" / "fixtures"


def skeleton(value: Any) -> Any:
    """The shape of a JSON value: keys and types, not values (ids and times change)."""
    if isinstance(value, dict):
        if value and all(k.isdigit() for k in value):  # keyed by token id (prompt logprobs)
            return {"<token id>": skeleton(list(value.values()))}
        return {k: skeleton(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        shapes = {json.dumps(skeleton(v), sort_keys=True) for v in value}
        return [json.loads(s) for s in sorted(shapes)]
    return type(value).__name__


def store_or_compare(name: str, completion: Completion, captured_from: str) -> dict[str, Any]:
    """Write the fixture (with UPDATE_REPLY_FIXTURES=1) or check the stored one has the live
    reply's shape; returns the stored fixture."""
    path = FIXTURES / f"{name}.json"
    live = {
        "captured_from": captured_from,
        "request": dataclasses.asdict(completion.request),
        "reply": completion.reply,
    }
    if os.environ.get("UPDATE_REPLY_FIXTURES") == "1":
        path.write_text(json.dumps(live, indent=1, sort_keys=True) + "\n")
    assert path.exists(), f"{path} is missing; capture it with UPDATE_REPLY_FIXTURES=1"
    stored: dict[str, Any] = json.loads(path.read_text())
    assert skeleton(stored["reply"]) == skeleton(live["reply"]), (
        f"{path.name} no longer has the live reply's shape; rerun with UPDATE_REPLY_FIXTURES=1"
    )
    return stored
