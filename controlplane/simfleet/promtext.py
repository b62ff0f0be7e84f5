"""A small Prometheus registry rendered in the text exposition format, as Rust's client does.

The simulated servers serve Dynamo's metric families with fixed label names. Like the Rust
`prometheus` crate, a labelled family shows no series until one is touched, and nothing has
`_created` samples (which is why `prometheus_client` is not used here).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

Labels = tuple[tuple[str, str], ...]


def log_buckets(low: float, high: float, count: int) -> list[float]:
    """Dynamo's `generate_log_buckets`: 0, then `count - 1` log-spaced values from `low` to
    `high`, rounded to 2 significant figures, consecutive duplicates removed."""
    buckets = [0.0]
    for i in range(1, count):
        value = math.exp(math.log(low) + (math.log(high) - math.log(low)) * i / (count - 1))
        rounded = _two_figures(value)
        if rounded != buckets[-1]:
            buckets.append(rounded)
    return buckets


def _two_figures(value: float) -> float:
    scale = 10 ** (1 - math.floor(math.log10(abs(value))))
    return float(round(value * scale) / scale)


def _number(value: float) -> str:
    if value == math.inf:
        return "+Inf"
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


def _label_text(labels: Labels, extra: Labels = ()) -> str:
    pairs = [*labels, *extra]
    if not pairs:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in pairs) + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


@dataclass
class _Family:
    name: str
    help: str
    kind: str  # counter | gauge | histogram
    label_names: tuple[str, ...]
    buckets: tuple[float, ...] = ()
    values: dict[Labels, float] = field(default_factory=dict)
    #: histogram: per label set, cumulative-free bucket counts, sum and count.
    observations: dict[Labels, tuple[list[int], list[float]]] = field(default_factory=dict)

    def key(self, labels: dict[str, str]) -> Labels:
        if set(labels) != set(self.label_names):
            raise ValueError(f"{self.name} takes labels {self.label_names}, got {sorted(labels)}")
        return tuple((n, str(labels[n])) for n in self.label_names)

    def render(self) -> Iterable[str]:
        if not self.values and not self.observations and self.label_names:
            return
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} {self.kind}"
        if self.kind != "histogram":
            for labels, value in (self.values or {(): 0.0}).items():
                yield f"{self.name}{_label_text(labels)} {_number(value)}"
            return
        for labels, (counts, totals) in self.observations.items():
            running = 0
            for bound, count in zip((*self.buckets, math.inf), counts, strict=True):
                running += count
                le = (("le", _number(bound) if bound != math.inf else "+Inf"),)
                yield f"{self.name}_bucket{_label_text(labels, le)} {running}"
            yield f"{self.name}_sum{_label_text(labels)} {_number(totals[0])}"
            yield f"{self.name}_count{_label_text(labels)} {running}"


class MetricsRegistry:
    """Counters, gauges and histograms with fixed label names, rendered as Prometheus text."""

    def __init__(self) -> None:
        self._families: dict[str, _Family] = {}

    def _add(self, family: _Family) -> None:
        self._families[family.name] = family

    def counter(self, name: str, help: str, labels: Sequence[str]) -> None:
        self._add(_Family(name, help, "counter", tuple(labels)))

    def gauge(self, name: str, help: str, labels: Sequence[str]) -> None:
        self._add(_Family(name, help, "gauge", tuple(labels)))

    def histogram(self, name: str, help: str, labels: Sequence[str], buckets: list[float]) -> None:
        self._add(_Family(name, help, "histogram", tuple(labels), tuple(buckets)))

    def inc(self, name: str, amount: float = 1.0, **labels: str) -> None:
        self.inc_labelled(name, labels, amount)

    def inc_labelled(self, name: str, labels: dict[str, str], amount: float = 1.0) -> None:
        """`inc` for label names that are Python keywords (`class`)."""
        family = self._families[name]
        key = family.key(labels)
        family.values[key] = family.values.get(key, 0.0) + amount

    def set(self, name: str, value: float, **labels: str) -> None:
        family = self._families[name]
        family.values[family.key(labels)] = value

    def observe(self, name: str, value: float, **labels: str) -> None:
        family = self._families[name]
        key = family.key(labels)
        counts, totals = family.observations.setdefault(
            key, ([0] * (len(family.buckets) + 1), [0.0])
        )
        # `le` is inclusive: a value equal to a bound falls in that bucket.
        index = next((i for i, b in enumerate(family.buckets) if value <= b), len(family.buckets))
        counts[index] += 1
        totals[0] += value

    def render(self) -> str:
        lines: list[str] = []
        for family in self._families.values():
            lines.extend(family.render())
        return "\n".join(lines) + "\n"
