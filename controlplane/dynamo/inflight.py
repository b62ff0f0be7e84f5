"""What happened to the requests in flight when a worker was paused, as its backend tells it.

A refresh pauses generation before it changes weights. What the engine does with the requests
still running is the pause mode's decision:

- `wait` (vLLM): they finish on the old weights before the engine pauses: **drained**;
- `abort` (vLLM, sidecar, SGLang): they are cut off and return an abort: **aborted**;
- `keep` (vLLM) / `retract`, `in_place` (SGLang): they are frozen and continue after resume,
  on the new weights: **kept** (their samples span two policies).

This module reads that from the calls a refresh journals; it keeps no state of its own (the
journal is the one writer). Only what a backend reports counts as reported: vLLM's pause reply
echoes the mode it applied, SGLang's disk update reports `num_paused_requests` and we send
`abort_all_requests` explicitly. The native sidecar's pause reply says only `paused`, so its
outcome is the mode we sent, marked as not confirmed by the backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DRAINED = "drained"
ABORTED = "aborted"
KEPT = "kept"

#: Every body field this module reads, (request or response, key): a reader may fetch these
#: alone (`refresh.inflight` does) and pass `{key: value}` bodies; a field read here and not
#: listed would be missing there.
READS = (
    ("request", "mode"),
    ("request", "abort_all_requests"),
    ("response", "mode"),
    ("response", "status"),
    ("response", "num_paused_requests"),
)

_BY_MODE = {"wait": DRAINED, "abort": ABORTED, "keep": KEPT, "retract": KEPT, "in_place": KEPT}


@dataclass(frozen=True, slots=True)
class InFlight:
    """One worker's in-flight outcome for one refresh."""

    outcome: str  # drained | aborted | kept
    mode: str
    #: How many requests, when the backend counts them (SGLang's `num_paused_requests`).
    count: int | None
    #: Where the outcome comes from, in words ("vLLM pause reply", ...).
    source: str
    #: False when the backend did not say and the outcome is the mode we asked for.
    confirmed: bool

    def describe(self) -> str:
        what = f"{self.count} {self.outcome}" if self.count is not None else self.outcome
        text = f"{what} (mode {self.mode}; {self.source})"
        return text if self.confirmed else f"{text}, not confirmed by the worker"


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def from_pause(family: str, request: Any, response: Any) -> InFlight | None:
    """The outcome a successful pause call reports; None when nothing can be said."""
    request, response = _dict(request), _dict(response)
    if family == "vllm":
        mode = response.get("mode")
        if isinstance(mode, str) and mode in _BY_MODE:
            return InFlight(_BY_MODE[mode], mode, None, "vLLM pause reply", True)
        return None
    if family == "vllm-sidecar":
        mode = request.get("mode")
        if isinstance(mode, str) and mode in _BY_MODE and response.get("status") == "paused":
            return InFlight(_BY_MODE[mode], mode, None, "mode sent to the sidecar", False)
        return None
    if family == "sglang":
        mode = request.get("mode", "abort")
        if isinstance(mode, str) and mode in _BY_MODE:
            return InFlight(_BY_MODE[mode], mode, None, "mode sent to SGLang", False)
    return None


def from_sglang_update(pause: InFlight | None, request: Any, response: Any) -> InFlight | None:
    """SGLang's disk update counts the requests it held across the update (`num_paused_requests`)
    and drops them when `abort_all_requests` was sent true."""
    request, response = _dict(request), _dict(response)
    count = response.get("num_paused_requests")
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        return pause
    mode = pause.mode if pause is not None else "abort"
    if request.get("abort_all_requests") is True:
        outcome = ABORTED if count else (pause.outcome if pause else ABORTED)
    else:
        outcome = KEPT if count else (pause.outcome if pause else DRAINED)
    return InFlight(outcome, mode, count, "SGLang update reply (num_paused_requests)", True)


def account(family: str, entries: list[tuple[str, Any, Any]]) -> InFlight | None:
    """One worker's outcome from its successful journal entries, oldest first:
    `(operation, request_body, response_body)`. The last pause counts (a retry re-pauses)."""
    result: InFlight | None = None
    for operation, request, response in entries:
        if operation == "pause":
            result = from_pause(family, request, response)
        elif operation == "update_from_disk" and family == "sglang":
            result = from_sglang_update(result, request, response)
    return result
