"""Shared pieces of the canary-analysis tests: a simulated fleet serving one policy lineage,
a source verified at v1, and a template of prompts drawn from the simulated vocabulary."""

from __future__ import annotations

import random

from controlplane.analysis.services import save_template
from controlplane.audit.recorder import Actor
from controlplane.simfleet.tokens import FIRST_EMITTED_ID, VOCAB_SIZE
from tests.integration.refresh.helpers import fleet_config

TEMPLATE = "policy-drift"
#: The canary is two workers; the rest (ten) stay on the old policy as the baseline.
CANARY = {
    "kind": "canary",
    "canary": {"size": 2, "evaluation": "none", "analysis": TEMPLATE, "timeout_seconds": 600},
}


def lineage_fleet_config(workers: int = 12, seed: int = 11):
    return fleet_config(workers, lineage={"seed": seed})


def prompts(n: int, seed: int = 3) -> list[dict]:
    rng = random.Random(seed)
    return [
        {
            "prompt": [rng.randrange(FIRST_EMITTED_ID, VOCAB_SIZE) for _ in range(6)],
            "continuation": None,
        }
        for _ in range(n)
    ]


def save(source, admin_user, n: int = 24, **body) -> None:
    save_template(
        source,
        TEMPLATE,
        {"prompts": prompts(n), "max_tokens": 8, **body},
        actor=Actor.for_user(admin_user),
    )


def canary(evaluation: str = "none", **canary_fields) -> dict:
    return {
        **CANARY,
        "canary": {**CANARY["canary"], "evaluation": evaluation, **canary_fields},
    }
