"""A refresh strategy as the JSON API, the trainer webhook and the CLI take it: the JSON schema
the OpenAPI document shows, and validation by `refresh.strategy.parse_strategy` with its
message turned into field errors (`{"strategy.max_unavailable": ["..."]}`)."""

from __future__ import annotations

import re
from typing import Any

from django.core.exceptions import ValidationError

from controlplane.refresh.strategy import (
    EVALUATIONS,
    KINDS,
    MAX_VERDICT_TIMEOUT_SECONDS,
    Strategy,
    parse_strategy,
)

_AMOUNT = {
    "oneOf": [
        {"type": "integer", "minimum": 0},
        {"type": "string", "pattern": r"^\d{1,3}%$"},
    ],
    "description": "a count of workers, or a percentage such as '10%'",
}

#: The strategy object for the OpenAPI document (validation is `parse_strategy`'s).
STRATEGY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "title": "Strategy",
    "description": "How the refresh walks its scope (docs/operate/strategies.md). Omitted: the "
    "source's default strategy (for a webhook: the endpoint's, then the source's).",
    "additionalProperties": False,
    "properties": {
        "kind": {"type": "string", "enum": list(KINDS), "default": KINDS[0]},
        "max_unavailable": {
            **_AMOUNT,
            "description": "waves and canary: most workers of a namespace paused at once",
        },
        "max_failed": {
            **_AMOUNT,
            "description": "failure budget: workers that may fail and be quarantined",
        },
        "admit_as_verified": {
            "type": "boolean",
            "description": "verified workers join the gate wave by wave",
        },
        "pause_after": {
            "type": "array",
            "items": {"type": "integer", "minimum": 1},
            "description": "waves after which the refresh waits until continued",
        },
        "canary": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "size": {**_AMOUNT, "description": "canary workers (or name instances)"},
                "instances": {"type": "array", "items": {"type": "string", "pattern": r"^\d+$"}},
                "evaluation": {"type": "string", "enum": list(EVALUATIONS)},
                "timeout_seconds": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": MAX_VERDICT_TIMEOUT_SECONDS,
                },
            },
        },
    },
}

_FIELD = re.compile(r"^(strategy\.)?([a-z_]+(?:\.[a-z_]+)?): ")


class StrategyRefused(Exception):
    """A strategy that does not validate; `errors` maps field paths to messages."""

    def __init__(self, errors: dict[str, list[str]]) -> None:
        super().__init__("; ".join(m for ms in errors.values() for m in ms))
        self.errors = errors


def field_errors(exc: ValidationError, prefix: str = "strategy") -> dict[str, list[str]]:
    """`parse_strategy`'s messages keyed by the field they name (`strategy` when none)."""
    errors: dict[str, list[str]] = {}
    for message in exc.messages:
        match = _FIELD.match(message)
        named = match.group(2) if match else "strategy"
        key = prefix if named == "strategy" else f"{prefix}.{named}"
        errors.setdefault(key, []).append(message)
    return errors


def checked(raw: Any, prefix: str = "strategy") -> Strategy:
    """The parsed strategy, or StrategyRefused with field errors."""
    try:
        return parse_strategy(raw)
    except ValidationError as exc:
        raise StrategyRefused(field_errors(exc, prefix)) from None
