"""Generate rollouts only on workers the gate verified (docs/integrate/gates.md).

Run it with CONTROLPLANE_URL, DYNAMO_FRONTEND_URL and CONTROLPLANE_TOKEN set; the tests run
this file as it is (tests/integration/refresh/test_docs_gate_pinning.py).
"""

import itertools
import os

import httpx

BASE = os.environ.get("CONTROLPLANE_URL", "http://127.0.0.1:8000")
FRONTEND = os.environ.get("DYNAMO_FRONTEND_URL", "http://dynamo-frontend:8000")
TOKEN = os.environ["CONTROLPLANE_TOKEN"]  # an API token with the viewer role or more
api = httpx.Client(base_url=BASE, headers={"Authorization": f"Bearer {TOKEN}"})


def verified_workers(source: str, namespace: str, version: str) -> list[int]:
    """The instance ids verified at `version`, or an error when the gate does not admit it."""
    gate = api.get(f"/api/v1/gates/{source}/{namespace}").raise_for_status().json()
    if gate["state"] != "open":  # not forced, not closed, not unknown
        raise RuntimeError(f"gate is {gate['state']} since {gate['since']}: {gate['reason']}")
    if gate["verified_version"] != version:
        raise RuntimeError(f"gate is open at {gate['verified_version']!r}, not {version!r}")
    return [int(i) for i in gate["verified_instances"]]  # u64 ids travel as strings


workers = itertools.cycle(verified_workers("prod-a", "rl-a", "step-1200"))
with httpx.Client(base_url=FRONTEND, timeout=120) as frontend:
    for prompt in ([5, 6, 7, 8], [9, 10, 11]):
        reply = (
            frontend.post(
                "/v1/completions",
                json={
                    "model": "policy",
                    "prompt": prompt,
                    "max_tokens": 64,
                    "temperature": 1.0,
                    "logprobs": 0,
                    "nvext": {
                        "backend_instance_id": next(workers),  # only a verified worker serves it
                        "extra_fields": ["completion_token_ids", "worker_id"],
                    },
                },
            )
            .raise_for_status()
            .json()
        )
        print(reply["nvext"]["completion_token_ids"], reply["nvext"]["worker_id"])
