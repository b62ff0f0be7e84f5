"""Bounded JSON parsing for everything that arrives from outside.

`json.loads` recurses once per nesting level: 100,000 `[` raise `RecursionError` (a crash, not
a parse error), and a few hundred levels that do parse blow up later code that walks the value
(hashing, rendering, PostgreSQL's jsonb). It also accepts `NaN` and `Infinity`, which are not
JSON and which PostgreSQL refuses to store. `loads_bounded` checks size and depth *before*
parsing, without recursion, and refuses those constants and NUL in strings (`\\u0000`, which
no PostgreSQL text or jsonb column holds), so every caller gets one
`ValueError` subclass with a message fit to show the sender.

Plain Python, no Django: the Dynamo client and the web intake share it.
"""

from __future__ import annotations

import json
import re
from typing import Any

#: Deep enough for every document we define (webhook events, API bodies, worker replies nest a
#: handful of levels), far below the interpreter's recursion limit.
DEFAULT_MAX_DEPTH = 64
DEFAULT_MAX_BYTES = 1024 * 1024

# A JSON string (with escapes) or one bracket. Strings are matched whole so brackets inside them
# are not counted; everything else is skipped by `finditer`.
_TOKENS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.DOTALL)
# `\u0000` as an escape: preceded by an odd number of backslashes (`\\u0000` is a backslash
# followed by the text "u0000"). A raw NUL byte is invalid JSON already (a control character).
_ESCAPED_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


class UnsafeJSON(ValueError):
    """The input is not JSON we accept. `code` is stable, `str()` is a one-line reason."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _refuse_constant(name: str) -> Any:
    raise UnsafeJSON("invalid_json", f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise UnsafeJSON("invalid_json", f"number {text[:40]} is out of range")
    return value


def check_depth(text: str, max_depth: int) -> None:
    """Raise `UnsafeJSON` when arrays/objects nest deeper than `max_depth` (no recursion)."""
    if text.count("[") + text.count("{") <= max_depth:
        # No nesting can be deeper than the brackets there are (those inside strings
        # included): nothing to walk. Every reply of a worker takes this path.
        return
    depth = 0
    for match in _TOKENS.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            if depth > max_depth:
                raise UnsafeJSON("json_too_deep", f"JSON nests deeper than {max_depth} levels")
        elif token in "]}":
            depth -= 1


def loads_bounded(
    data: bytes | bytearray | str,
    *,
    max_depth: int = DEFAULT_MAX_DEPTH,
    max_bytes: int = DEFAULT_MAX_BYTES,
    allow_nul: bool = False,
) -> Any:
    """Parse `data` as JSON within `max_bytes` and `max_depth`; no NaN or Infinity, and no
    NUL in strings unless `allow_nul` (for callers that check each value themselves and say
    which one held it: the Dynamo client's `limits`).

    Raises `UnsafeJSON` (a `ValueError`) for every problem, including invalid UTF-8.
    """
    if len(data) > max_bytes:
        raise UnsafeJSON("payload_too_large", f"JSON is over {max_bytes} bytes")
    if isinstance(data, bytes | bytearray):
        try:
            text = bytes(data).decode(json.detect_encoding(data))
        except (UnicodeDecodeError, LookupError):
            raise UnsafeJSON("invalid_json", "JSON is not valid UTF-8") from None
    else:
        text = data
    check_depth(text, max_depth)
    if not allow_nul and "u0000" in text and _ESCAPED_NUL.search(text):
        # PostgreSQL stores NUL in no text or jsonb column: refused here, where every caller
        # answers the sender, rather than as a database error after it (controlplane/nul.py).
        raise UnsafeJSON("nul_character", "JSON strings may not contain NUL (\\u0000)")
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except UnsafeJSON:
        raise
    except (ValueError, RecursionError) as exc:
        # ValueError covers JSONDecodeError and the interpreter's integer digit limit.
        raise UnsafeJSON("invalid_json", f"not valid JSON: {str(exc)[:200]}") from None
