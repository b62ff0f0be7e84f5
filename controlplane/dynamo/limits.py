"""What the control plane can store of a value that came from a Dynamo deployment.

Discovery payloads and probe replies end up in PostgreSQL columns. The client boundary
(`discovery.parse_discovery`, the probe code) enforces these limits, so a value it accepts can
always be stored; `fleet.models` takes its `max_length`s from the same constants, and a test
checks that every column is at least as wide as the limit for what lands in it.

What a PostgreSQL text value cannot hold, whatever its length:

- NUL (U+0000): `text`, `varchar` and `jsonb` all refuse it;
- lone UTF-16 surrogates (JSON `"\\ud800"` decodes to one): not encodable as UTF-8.

Every other character, control characters included (C0, C1, bidi overrides), is stored as
data; escaping it for display is the templates' job.

No Django imports here: this module is part of the plain-Python Dynamo client.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

# ---- columns a discovered worker lands in (characters, as varchar counts them) ----------
#: namespace, component, endpoint (also the listener's reported namespace).
NAME_MAX = 200
#: A u64 in decimal.
INSTANCE_ID_MAX = 20
#: `dyn://<ns>.<component>.<endpoint>`: three names and some punctuation.
REQUEST_PLANE_URL_MAX = 700
#: system_url, admin_base_url.
URL_MAX = 500
#: The model card's display name.
MODEL_MAX = 300
#: One advertised route name; admin call URLs are `system_url/engine/<route>`.
ROUTE_MAX = 200
#: Advertised routes per worker (real workers advertise about twenty).
ROUTES_MAX = 256
#: The `transport` object, as compact JSON (Dynamo's is one short address string).
TRANSPORT_JSON_MAX = 2048
#: A worker's probe `error` text (a text column; bounded so one worker cannot bloat a run).
WORKER_ERROR_MAX = 4096
#: `world_size` is a u32 > 0 (contract §1.3), so its column must hold 2^32-1.
WORLD_SIZE_MAX = 2**32 - 1
#: A weight version read from a worker, as compact JSON for non-strings. Matches what a
#: refresh can set (the refresh form's weight_version is 200 characters).
WEIGHT_VERSION_MAX = 200

# ---- payload-wide limits -----------------------------------------------------------------
#: The contract's payload is four levels deep; anything past this is not a listener.
MAX_DEPTH = 32
#: Digits in a JSON number. A u64 has 20; Python refuses to even parse past 4,300.
MAX_NUMBER_DIGITS = 40
#: Worker entries in one payload (a listener reporting thousands of workers is ~1 MB).
MAX_ENTRIES = 50_000

# ---- what we keep of values we refuse ------------------------------------------------------
#: A rejected entry's reason.
REASON_MAX = 300
#: A rejected entry's raw value, as JSON text, before it is kept only as a truncated preview.
RAW_PREVIEW_MAX = 2000
#: Error text built from outside data (listener error bodies, probe replies).
ERROR_TEXT_MAX = 2000


_SURROGATE = re.compile("[\ud800-\udfff]")


def text_problem(value: str, limit: int) -> str | None:
    """Why `value` cannot be stored in a `limit`-character column, or None when it can."""
    if "\x00" in value:
        return "contains a NUL character"
    if len(value) > limit:
        return f"is {len(value)} characters long, over the {limit}-character limit"
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "contains a lone UTF-16 surrogate (not valid Unicode)"
    return None


def storable_text(value: str, limit: int = ERROR_TEXT_MAX) -> str:
    """Our own message that quotes outside text, made storable: NUL and lone surrogates become
    U+FFFD and the text is cut to `limit` characters. Only for messages, never for data."""
    if "\x00" in value:
        value = value.replace("\x00", "\ufffd")
    if not value.isascii():
        value = _SURROGATE.sub("\ufffd", value)
    return value if len(value) <= limit else value[: limit - 1] + "…"


def json_problem(value: Any, *, max_chars: int, max_depth: int = MAX_DEPTH) -> str | None:
    """Why a decoded JSON value cannot be stored in a `jsonb` column within `max_chars` of
    compact JSON, or None when it can. Iterative, so no nesting can exhaust the stack."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > max_depth:
            return f"is nested more than {max_depth} levels deep"
        if isinstance(item, str):
            if problem := text_problem(item, max_chars):
                return f"has a string that {problem}"
        elif isinstance(item, float):
            if not math.isfinite(item):
                return "contains NaN or Infinity, which JSON does not allow"
        elif isinstance(item, int) and not isinstance(item, bool):
            if len(str(abs(item))) > MAX_NUMBER_DIGITS:  # abs: a sign is not a digit
                return f"has a number over {MAX_NUMBER_DIGITS} digits"
        elif isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    return "has a non-string key"
                if problem := text_problem(key, max_chars):
                    return f"has a key that {problem}"
                stack.append((child, depth + 1))
        elif isinstance(item, list | tuple):
            stack.extend((child, depth + 1) for child in item)
        elif item is not None and not isinstance(item, bool):
            return f"holds a {type(item).__name__}, which is not JSON"
    size = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")))
    if size > max_chars:
        return f"is {size} characters as JSON, over the {max_chars}-character limit"
    return None


def weight_version_problem(version: Any) -> str | None:
    """Why a version read from `get_weight_version` cannot be recorded, or None.

    Dynamo's vLLM worker stores any JSON value as its version (contract §4), so small JSON
    values are kept as they are; what we could never have set — longer than a refresh's
    version, NaN, NUL — is a probe error for that worker.
    """
    if isinstance(version, str):
        problem = text_problem(version, WEIGHT_VERSION_MAX)
    else:
        problem = json_problem(version, max_chars=WEIGHT_VERSION_MAX, max_depth=8)
    return f"weight version {problem}" if problem else None


def raw_preview(value: Any) -> Any:
    """What a refused value is kept as for display: the value itself when it is small and
    storable, else a truncated JSON text with NUL and surrogates as ASCII escapes."""
    if json_problem(value, max_chars=RAW_PREVIEW_MAX) is None:
        return value
    try:
        text = json.dumps(value, ensure_ascii=True, separators=(",", ":"))
    except (ValueError, TypeError, RecursionError):
        text = repr(value)
    text = storable_text(text, RAW_PREVIEW_MAX)
    return text
