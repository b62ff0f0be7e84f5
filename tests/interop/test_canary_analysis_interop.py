"""A canary analysis through the real Dynamo 1.6.1 frontend: the analysis's own collection
(`refresh/intents/analysis.collect`: the baseline's greedy reply as the reference, both
cohorts teacher-forced on it through top-level `prompt_logprobs`, pinned per worker) and the
judge, on two replicas of the interop suite's generating worker.

1.6.1 returns `nvext.prompt_logprobs` on this path, so the drift metrics have data: they are
judged, not marked unavailable. The scripted engine gives every token the same log
probability, so both cohorts measure the same drift values and the judge passes; a canary
whose replies differ (another version) still shows in the output metrics' inputs.
"""

from __future__ import annotations

import httpx
import pytest

from controlplane.analysis.judge import judge
from controlplane.analysis.metrics import per_prompt_values
from controlplane.analysis.spec import parse_template
from controlplane.dynamo.policy import OutboundPolicy
from controlplane.refresh.intents.analysis import Cohorts, Member, collect
from tests.interop.conftest import WorkerSpec
from tests.interop.programs.synthetic_model import SYNTHETIC_LOGPROB

pytestmark = pytest.mark.interop

MODEL = "tiny-policy"
LOOPBACK = OutboundPolicy.from_cidrs(["127.0.0.0/8"])


async def test_a_canary_analysis_judges_drift_through_the_real_frontend(dynamo_deployment):
    dep = dynamo_deployment([WorkerSpec("backend", model_name=MODEL) for _ in range(2)])
    listed = dep.listing()["workers"]
    baseline, canary = sorted(listed, key=lambda w: int(w["instance_id"]))
    for worker, version in ((baseline, "step-1"), (canary, "step-2")):
        httpx.post(
            f"{worker['system_url']}/engine/set_weight_version",
            json={"weight_version": version},
            timeout=10,
        ).raise_for_status()
    spec = parse_template(
        {"prompts": [{"prompt": [5 + i, 40, 300 + i]} for i in range(20)], "max_tokens": 4}
    )
    cohorts = Cohorts(
        baseline=(Member("baseline", str(baseline["instance_id"]), MODEL),),
        canary=(Member("canary", str(canary["instance_id"]), MODEL),),
    )

    base_obs, canary_obs = await collect(spec, cohorts, dep.frontend_url, LOOPBACK, timeout=30)

    assert [o.error for o in base_obs + canary_obs] == [None] * 40
    # Pinned: each cohort's replies came from its own worker.
    assert {o.instance_id for o in base_obs} == {str(baseline["instance_id"])}
    assert {o.instance_id for o in canary_obs} == {str(canary["instance_id"])}
    # Teacher forcing through prompt logprobs worked on both cohorts, on the baseline's reply.
    for b, c in zip(base_obs, canary_obs, strict=True):
        assert b.continuation_logprobs is not None and c.continuation_logprobs is not None
        assert len(b.continuation_logprobs) == len(b.completion_ids) == 4
        assert set(c.continuation_logprobs) == {SYNTHETIC_LOGPROB}
    # Another version generates other tokens: the replies differ, the drift values do not.
    pairs = list(zip(base_obs, canary_obs, strict=True))
    assert any(b.completion_ids != c.completion_ids for b, c in pairs)

    base_values, canary_values = per_prompt_values(base_obs, canary_obs, max_tokens=4)
    report = judge(spec.judge, base_values, canary_values)
    verdicts = {m["name"]: m for m in report["metrics"]}
    for name in ("ref_logprob", "kl_estimate"):
        assert verdicts[name]["verdict"] == "pass", verdicts[name]
        assert verdicts[name]["n_baseline"] == verdicts[name]["n_canary"] == 20
    assert report["outcome"] == "pass", report["summary"]
