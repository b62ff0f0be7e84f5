"""The canary analysis' scoring client and metrics reader against real Dynamo 1.6.1.

Two replicas of one model on the real runtime, behind the real frontend, hold two policies
(a baseline and a canary). `observe_cohort` sends each cohort the same prompts pinned with
`nvext.backend_instance_id`: streamed greedy generation (time to first token) and teacher
forcing of a reference continuation through top-level `prompt_logprobs`. 1.6.1 returns
`nvext.prompt_logprobs` on that path, so the continuation's log probabilities are measured
(the values are the scripted engine's; the frontend path is real). Frontend and worker
`/metrics` snapshots taken around the traffic must count exactly what was sent, and the
stored captures (tests/fixtures/dynamo/) must still have the live shapes.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from controlplane.dynamo.frontend_metrics import (
    fetch_frontend_snapshot,
    fetch_worker_snapshot,
    serving_delta,
    worker_delta,
)
from controlplane.dynamo.http import make_client
from controlplane.dynamo.policy import OutboundPolicy
from controlplane.dynamo.scoring import CohortPrompt, ScoringRequest, observe, observe_cohort
from tests.integration.trainer.replies import skeleton
from tests.interop.conftest import WorkerSpec
from tests.interop.programs.synthetic_model import SYNTHETIC_LOGPROB, policy_tokens

pytestmark = pytest.mark.interop

MODEL = "tiny-policy"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "dynamo"
PROMPTS = ([5, 6, 7, 8], [40, 41], [300, 12, 99, 7, 7])
MAX_TOKENS = 4
LOOPBACK = OutboundPolicy.from_cidrs(["127.0.0.0/8"])
#: The frontend families `frontend_metrics` reads, and the labels it reads them by.
READ_FAMILIES = (
    "dynamo_frontend_requests",
    "dynamo_frontend_time_to_first_token_seconds",
    "dynamo_frontend_request_duration_seconds",
    "dynamo_frontend_inflight_requests",
    "dynamo_frontend_worker_last_time_to_first_token_seconds",
)


def shapes(text: str, names: tuple[str, ...]) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Type and label names of the named families in an exposition."""
    out = {}
    for family in text_string_to_metric_families(text):
        if family.name in names:
            labels = {k for s in family.samples for k in s.labels if k != "le"}
            out[family.name] = (family.type, tuple(sorted(labels)))
    return out


async def test_scoring_and_serving_metrics_through_the_real_frontend(dynamo_deployment):
    dep = dynamo_deployment([WorkerSpec("backend", model_name=MODEL) for _ in range(2)])
    listed = dep.listing()["workers"]
    baseline, canary = sorted(listed, key=lambda w: int(w["instance_id"]))
    # Our records keep instance ids as text (exact u64); the listing has JSON integers.
    versions = {str(baseline["instance_id"]): "step-1", str(canary["instance_id"]): "step-2"}
    for worker in listed:
        httpx.post(
            f"{worker['system_url']}/engine/set_weight_version",
            json={"weight_version": versions[str(worker["instance_id"])]},
            timeout=10,
        ).raise_for_status()
    # The reference continuation of each prompt is the baseline policy's greedy reply.
    prompts = [
        CohortPrompt(i, tuple(p), tuple(policy_tokens("step-1", p, 3)))
        for i, p in enumerate(PROMPTS)
    ]

    async with make_client(timeout=30) as client:
        front_before = await fetch_frontend_snapshot(
            client, dep.frontend_url, policy=LOOPBACK, timeout=10
        )
        workers_before = {
            str(w["instance_id"]): await fetch_worker_snapshot(
                client, w["system_url"], policy=LOOPBACK, timeout=10
            )
            for w in listed
        }
        seen = {}
        for cohort in (baseline, canary):
            seen[str(cohort["instance_id"])] = await observe_cohort(
                client,
                dep.frontend_url,
                model=MODEL,
                instance_ids=[str(cohort["instance_id"])],
                prompts=prompts,
                max_tokens=MAX_TOKENS,
                policy=LOOPBACK,
                timeout=30,
                concurrency=2,
            )
        unknown = await observe(
            client,
            dep.frontend_url,
            model=MODEL,
            instance_id=max(int(w["instance_id"]) for w in listed) + 1,
            prompt_index=0,
            prompt_ids=PROMPTS[0],
            continuation_ids=None,
            max_tokens=MAX_TOKENS,
            policy=LOOPBACK,
            timeout=30,
        )
        front_after = await fetch_frontend_snapshot(
            client, dep.frontend_url, policy=LOOPBACK, timeout=10
        )
        workers_after = {
            str(w["instance_id"]): await fetch_worker_snapshot(
                client, w["system_url"], policy=LOOPBACK, timeout=10
            )
            for w in listed
        }

    for instance, observations in seen.items():
        assert [o.prompt_index for o in observations] == [0, 1, 2]
        for o, prompt in zip(observations, PROMPTS, strict=True):
            assert o.error is None, o.error
            assert o.instance_id == instance
            # Each cohort answered with its own policy: the pin held.
            assert list(o.completion_ids) == policy_tokens(versions[instance], prompt, MAX_TOKENS)
            assert o.completion_logprobs == (SYNTHETIC_LOGPROB,) * MAX_TOKENS
            assert o.finish_reason == "length"
            # 1.6.1 returns prompt logprobs on this path: one value per continuation token.
            assert o.continuation_logprobs == (SYNTHETIC_LOGPROB,) * 3
            assert o.ttft_ms is not None and o.total_ms is not None
            assert 0 < o.ttft_ms <= o.total_ms
    assert unknown.error is not None and unknown.error.startswith("HTTP 400: Invalid request")

    # The frontend counted exactly what was sent: per prompt and cohort one streamed and one
    # unary request, and the unroutable pin as a `validation` error.
    sent = len(PROMPTS) * 2 * 2
    delta = serving_delta(front_before, front_after)[MODEL]
    assert delta.requests == sent + 1 and delta.errors == 1
    assert front_after.models[MODEL].errors_by_type == {"validation": 1}
    assert delta.error_ratio == pytest.approx(1 / (sent + 1))
    assert delta.ttft_ms[0.5] is not None and delta.duration_ms[0.99] is not None
    assert set(front_after.workers) == set(versions)
    # Each worker's own system server counted its generate calls, under its instance id.
    for instance, after in workers_after.items():
        counted = worker_delta(workers_before[instance], after)
        assert set(counted) == {int(instance)}
        assert counted[int(instance)].requests == len(PROMPTS) * 2
        assert counted[int(instance)].errors == 0

    # The stored captures still have the live shapes.
    live_text = httpx.get(dep.frontend_url + "/metrics", timeout=10).text
    stored_text = (FIXTURES / "frontend-metrics-1.6.1.txt").read_text()
    assert shapes(live_text, READ_FAMILIES) == shapes(stored_text, READ_FAMILIES)
    request = ScoringRequest.build(
        model=MODEL,
        instance_id=baseline["instance_id"],
        prompt_ids=PROMPTS[0],
        continuation_ids=prompts[0].continuation_ids,
        max_tokens=1,
    )
    live_reply = httpx.post(
        dep.frontend_url + "/v1/completions", json=request.teacher_forcing_body(), timeout=30
    ).json()
    stored = json.loads((FIXTURES / "completions-1.6.1.json").read_text())["exchanges"]
    live_nvext = skeleton(live_reply["nvext"])
    assert (
        live_nvext["prompt_logprobs"]
        == skeleton(stored["tf_full"]["body"]["nvext"])["prompt_logprobs"]
    )
    assert live_reply["nvext"]["prompt_logprobs"][0] is None
    assert len(live_reply["nvext"]["prompt_logprobs"]) == len(PROMPTS[0]) + 3
