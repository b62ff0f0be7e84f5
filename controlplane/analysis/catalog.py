"""The metrics a canary analysis can compute, by name: what each measures, its unit, the group
it belongs to and the direction of change that counts against a canary by default. Templates
name metrics from here (`analysis/spec.py` refuses others); `analysis/metrics.py` computes
them from observations.
"""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.analysis.rules import DECREASE, EITHER, INCREASE

DRIFT = "drift"
OUTPUT = "output"
SERVING = "serving"
GROUPS = (DRIFT, OUTPUT, SERVING)


@dataclass(frozen=True)
class MetricInfo:
    name: str
    group: str
    unit: str
    default_direction: str
    what: str


CATALOG: dict[str, MetricInfo] = {
    m.name: m
    for m in (
        MetricInfo(
            "ref_logprob",
            DRIFT,
            "nats/token",
            DECREASE,
            "mean teacher-forced log probability of the reference continuation",
        ),
        MetricInfo(
            "kl_estimate",
            DRIFT,
            "nats/token",
            INCREASE,
            "KL(baseline || cohort) estimated on the reference continuation's tokens",
        ),
        MetricInfo("zero_tokens", OUTPUT, "share", INCREASE, "replies with no generated token"),
        MetricInfo(
            "non_terminal",
            OUTPUT,
            "share",
            INCREASE,
            "replies that ended other than by EOS, a stop or the length limit",
        ),
        MetricInfo(
            "bad_logprobs", OUTPUT, "share", INCREASE, "replies with NaN or absent logprobs"
        ),
        MetricInfo(
            "distinct_2", OUTPUT, "ratio", DECREASE, "distinct bigrams over bigrams (repetition)"
        ),
        MetricInfo(
            "length_ratio", OUTPUT, "ratio", EITHER, "generated tokens over the token budget"
        ),
        MetricInfo("error", SERVING, "share", INCREASE, "requests that failed"),
        MetricInfo("ttft_ms", SERVING, "ms", INCREASE, "time to the first token"),
        MetricInfo("total_ms", SERVING, "ms", INCREASE, "time to the end of the reply"),
    )
}
