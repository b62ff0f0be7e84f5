"""Serving latency of simulated workers: time to first token and time per output token.

Each is a log-normal distribution given by its median and shape (`sigma`), the usual fit for
serving latencies (a floor, a long right tail). A worker draws from its own generator, seeded
from the fleet seed and its instance id, so a seeded fleet replays the same latencies request
by request. The defaults are a millisecond or less so tests stay fast; a slow worker is made
by giving it a larger median (`WorkerSpec.latency`, or `PUT /_sim/workers/<key>/latency`).
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, field, fields
from typing import Any


@dataclass
class LatencyDistribution:
    """Log-normal with this median (seconds) and shape; a zero median means no delay."""

    median: float = 0.0
    sigma: float = 0.25

    def __post_init__(self) -> None:
        for name in ("median", "sigma"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"latency {name} must be a number")
        if not 0 <= self.median <= 600:
            raise ValueError("latency median must be in [0, 600] seconds")
        if not 0 <= self.sigma <= 3:
            raise ValueError("latency sigma must be in [0, 3]")

    def draw(self, rng: random.Random) -> float:
        if self.median <= 0:
            return 0.0
        return self.median * math.exp(rng.gauss(0.0, self.sigma)) if self.sigma else self.median


@dataclass
class LatencyConfig:
    """Per-worker serving latency (the fleet default, or one worker's override)."""

    ttft: LatencyDistribution = field(
        default_factory=lambda: LatencyDistribution(median=0.001, sigma=0.25)
    )
    per_token: LatencyDistribution = field(
        default_factory=lambda: LatencyDistribution(median=0.0002, sigma=0.25)
    )

    def __post_init__(self) -> None:
        if isinstance(self.ttft, dict):
            self.ttft = _distribution(self.ttft)
        if isinstance(self.per_token, dict):
            self.per_token = _distribution(self.per_token)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | LatencyConfig) -> LatencyConfig:
        """`{"ttft": {"median": 0.05}, "per_token": {"median": 0.002, "sigma": 0.1}}`."""
        if isinstance(data, LatencyConfig):
            return data
        if not isinstance(data, dict):
            raise ValueError("latency must be an object with 'ttft' and/or 'per_token'")
        unknown = set(data) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown latency keys: {sorted(unknown)}")
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _distribution(data: dict[str, Any]) -> LatencyDistribution:
    unknown = set(data) - {"median", "sigma"}
    if unknown:
        raise ValueError(f"unknown latency distribution keys: {sorted(unknown)}")
    return LatencyDistribution(**data)


class LatencySampler:
    """One worker's seeded draws."""

    def __init__(self, config: LatencyConfig, seed: str) -> None:
        self.config = config
        self._rng = random.Random(seed)

    def ttft(self) -> float:
        return self.config.ttft.draw(self._rng)

    def per_token(self) -> float:
        return self.config.per_token.draw(self._rng)
