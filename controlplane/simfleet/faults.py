"""Fault injection: what can go wrong on one worker route, and how often.

Faults are attached to a worker and a route name. Route names are the engine routes exactly as
advertised (`pause_generation`, `control/pause_generation`, ...) plus three pseudo-routes:

- `probe`    the listener's request-plane `{"method":"routes"}` call to the worker's `rl` endpoint;
- `generate` frontend generation served by this worker;
- `health`   the worker's `/health` and `/live`;
- `*`        every engine route of the worker.

A fault fires `times` times (one-shot is `times=1`) or forever (`times=None`), from the
moment it is armed or, with `after`, from that many seconds later ("this worker starts failing
at T": a background check must catch a worker that was healthy when the gate reopened).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal, get_args

FaultKind = Literal[
    "latency",  # sleep `seconds`, then answer normally
    "hang",  # sleep `seconds` (default an hour), then answer normally
    "error_body",  # HTTP 200 with the family's error body (`status: error` / `success: false`)
    "http_error",  # HTTP `status` (default 500) with the system server's handler-error body
    "drop",  # close the connection without any response
    "crash",  # the worker process dies: connection dropped and the worker leaves the fleet
    "missing",  # route answers 404 (probe: the worker is not listed at all)
    "body",  # answer HTTP 200 with `body` verbatim (probe: `body` is the descriptor chunk)
    "probe_error",  # probe only: the descriptor is `{"status":"error","message":message}`
    "revert_version",  # after the route succeeds, the worker silently reverts its version
    "cancel",  # generate only: the request is cancelled part-way (finish `stop`/`cancelled`)
    "wrong_tokens",  # generate only: the worker emits ids that do not match its version
    # generate only: the right weights under different batching numerics: every chosen
    # logprob moves by up to `magnitude`; with `position` set, the first near-tie at or after
    # it flips to the runner-up token and the completion continues from there
    "logprob_jitter",
    # generate only: the engine fails after it started (past its time to first token): the
    # frontend answers HTTP `status` (default 500) with the engine's `message`
    "engine_error",
]
FAULT_KINDS: tuple[str, ...] = get_args(FaultKind)

PROBE = "probe"
GENERATE = "generate"
HEALTH = "health"
ANY_ROUTE = "*"

DEFAULT_HANG_SECONDS = 3600.0


@dataclass
class Fault:
    """One injected misbehaviour. Build with the class-method shortcuts or `from_dict`."""

    kind: FaultKind
    seconds: float = 0.0
    status: int = 500
    message: str = "injected fault"
    body: Any = None
    #: How many more times the fault fires; None is persistent.
    times: int | None = None
    #: logprob_jitter: the largest logprob offset, and where a near-tie may first flip.
    magnitude: float = 0.0
    position: int | None = None
    #: Seconds after arming before the fault starts firing (None: at once).
    after: float | None = None
    #: Monotonic time from which it fires; set when armed (`FaultBook.add`).
    active_at: float | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.after is not None and (
            isinstance(self.after, bool)
            or not isinstance(self.after, int | float)
            or not 0 <= self.after <= 86400
        ):
            raise ValueError("after must be a number of seconds in [0, 86400] or None")
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}; expected one of {FAULT_KINDS}")
        if self.kind == "hang" and not self.seconds:
            self.seconds = DEFAULT_HANG_SECONDS
        if self.times is not None and self.times < 1:
            raise ValueError("times must be positive or None (persistent)")
        if not isinstance(self.magnitude, int | float) or not 0 <= self.magnitude < 10:
            raise ValueError("magnitude must be a number in [0, 10)")
        if self.position is not None and (not isinstance(self.position, int) or self.position < 0):
            raise ValueError("position must be a non-negative integer or None")

    @classmethod
    def from_dict(cls, data: dict[str, Any] | Fault) -> Fault:
        if isinstance(data, Fault):
            return data
        known = {f.name for f in fields(cls)} - {"active_at"}
        unknown = set(data) - known - {"once"}
        if unknown:
            raise ValueError(f"unknown fault keys: {sorted(unknown)}")
        values = {k: v for k, v in data.items() if k in known}
        if data.get("once"):
            values["times"] = 1
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """What `from_dict` takes back (the arming time is the fleet's own bookkeeping)."""
        data = asdict(self)
        del data["active_at"]
        return data

    # Shortcuts keep test code readable: `Fault.hang(5, once=True)`.
    @classmethod
    def latency(cls, seconds: float, *, once: bool = False) -> Fault:
        return cls("latency", seconds=seconds, times=1 if once else None)

    @classmethod
    def hang(cls, seconds: float = DEFAULT_HANG_SECONDS, *, once: bool = False) -> Fault:
        return cls("hang", seconds=seconds, times=1 if once else None)

    @classmethod
    def error(cls, message: str = "injected fault", *, once: bool = False) -> Fault:
        return cls("error_body", message=message, times=1 if once else None)

    @classmethod
    def http(
        cls,
        status: int = 500,
        message: str = "injected fault",
        *,
        once: bool = False,
        after: float | None = None,
    ) -> Fault:
        return cls(
            "http_error", status=status, message=message, times=1 if once else None, after=after
        )

    @classmethod
    def engine_error(
        cls,
        message: str = "engine error: injected fault",
        *,
        status: int = 500,
        once: bool = False,
        after: float | None = None,
    ) -> Fault:
        """Generation fails inside the engine, from now on or from `after` seconds on."""
        return cls(
            "engine_error", status=status, message=message, times=1 if once else None, after=after
        )

    @classmethod
    def drop(cls, *, once: bool = False) -> Fault:
        return cls("drop", times=1 if once else None)

    @classmethod
    def crash(cls) -> Fault:
        return cls("crash", times=1)

    @classmethod
    def missing(cls, *, once: bool = False) -> Fault:
        return cls("missing", times=1 if once else None)

    @classmethod
    def reply(cls, body: Any, *, once: bool = False) -> Fault:
        return cls("body", body=body, times=1 if once else None)

    @classmethod
    def probe_error(cls, message: str = "engine is dead", *, once: bool = False) -> Fault:
        return cls("probe_error", message=message, times=1 if once else None)

    @classmethod
    def revert_version(cls, *, once: bool = True) -> Fault:
        return cls("revert_version", times=1 if once else None)

    @classmethod
    def cancel(cls, *, once: bool = False) -> Fault:
        return cls("cancel", times=1 if once else None)

    @classmethod
    def wrong_tokens(cls, *, once: bool = False) -> Fault:
        return cls("wrong_tokens", times=1 if once else None)

    @classmethod
    def logprob_jitter(
        cls, magnitude: float = 0.002, *, flip_from: int | None = None, once: bool = False
    ) -> Fault:
        return cls(
            "logprob_jitter", magnitude=magnitude, position=flip_from, times=1 if once else None
        )


class FaultBook:
    """The faults armed on one worker, keyed by route name."""

    __slots__ = ("_by_route",)

    def __init__(self) -> None:
        self._by_route: dict[str, list[Fault]] = {}

    def __bool__(self) -> bool:
        return bool(self._by_route)

    def add(self, route: str, fault: Fault) -> None:
        fault.active_at = time.monotonic() + (fault.after or 0.0)
        self._by_route.setdefault(route, []).append(fault)

    def clear(self) -> None:
        self._by_route.clear()

    def take(self, route: str, *, wildcard: bool = True) -> list[Fault]:
        """The faults firing on this call of `route`, consuming one use of each one-shot."""
        if not self._by_route:
            return []
        fired: list[Fault] = []
        names = (route, ANY_ROUTE) if wildcard else (route,)
        now = time.monotonic()
        for name in names:
            armed = self._by_route.get(name)
            if not armed:
                continue
            for fault in list(armed):
                if fault.active_at is not None and fault.active_at > now:
                    continue  # armed for later: not yet, and no use consumed
                fired.append(fault)
                if fault.times is not None:
                    fault.times -= 1
                    if fault.times == 0:
                        armed.remove(fault)
            if not armed:
                del self._by_route[name]
        return fired

    def to_dict(self) -> dict[str, list[dict[str, Any]]]:
        return {route: [f.to_dict() for f in faults] for route, faults in self._by_route.items()}
