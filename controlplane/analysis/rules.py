"""What the judge is told: which metrics count, in which direction, how much, and the score
thresholds. Built from a stored analysis template (`analysis/spec.py` parses and validates it)
and read by `analysis/judge.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: The direction of change that counts against the canary.
INCREASE = "increase"
DECREASE = "decrease"
EITHER = "either"
DIRECTIONS = (INCREASE, DECREASE, EITHER)


@dataclass(frozen=True)
class MetricRule:
    #: A metric `analysis/metrics.py` computes (`metrics.METRICS`).
    name: str
    #: Which change is bad: `increase`, `decrease` or `either`.
    direction: str
    #: The shift (Hodges-Lehmann estimate of canary - baseline, in the metric's own units)
    #: tolerated in the bad direction before a significant difference fails the metric.
    allowed_effect: float
    #: A critical metric that fails makes the whole analysis fail, whatever the score.
    critical: bool = False
    #: The group whose weight this metric shares with the group's other metrics.
    group: str = "default"
    #: Without enough data for this metric the outcome is inconclusive, not a pass.
    must_have_data: bool = False


@dataclass(frozen=True)
class JudgeSpec:
    metrics: tuple[MetricRule, ...]
    #: Group name -> weight; a group not named weighs as much as the mean of those named (or 1).
    group_weights: dict[str, float] = field(default_factory=dict)
    #: Score (0-100) at or above which the canary passes.
    pass_score: float = 95.0
    #: Score at or above which (and below `pass_score`) the canary is marginal; below it fails.
    marginal_score: float = 75.0
    #: Significance level of each metric's two-sided Mann-Whitney U test.
    alpha: float = 0.05
    #: Fewer usable per-prompt values than this in either cohort: the metric has no data.
    min_samples: int = 5
