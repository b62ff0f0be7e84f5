"""The planner's whole output over a varied fleet, against a recorded golden file.

`test_planning.py` states the plan of each family by hand; this test pins everything else: every
family with its full routes and with each route missing in turn, every update method, pause mode,
flush policy and verification switch, and the worker faults discovery reports (probe errors, no
system URL, a URL outside the allowed networks, no world size, no model). A refactor of the
planner must leave every stored field — family, calls, blockers, flush reason, method, pause mode,
ranks — exactly as it was.

After an intended change of the plans, record the new golden file with
`UPDATE_PLAN_GOLDEN=1 pytest tests/unit/refresh/test_plan_golden.py` and review its diff.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from controlplane.dynamo.families import FAMILIES
from controlplane.dynamo.policy import OutboundPolicy
from controlplane.fleet.models import Worker, WorkerState
from controlplane.refresh.planning import (
    normalize_fingerprint,
    normalize_target,
    normalize_verification,
    plan_worker,
)
from controlplane.refresh.targets import PAUSE_MODE_CHOICES
from tests.unit.refresh.builders import (
    DISK,
    SGLANG_ROUTES,
    SIDECAR_ROUTES,
    VLLM_ROUTES,
    discovered,
    sglang_static_worker,
)

GOLDEN = Path(__file__).with_name("plan_golden.json")
POLICY = OutboundPolicy.from_cidrs(["10.0.0.0/8"])

DISTRIBUTED_FLAT = {
    "weight_version": "v8",
    "method": "distributed",
    "group": {"master_address": "10.0.0.1", "master_port": 29500, "group_name": "wu"},
    "update": {"names": ["lm_head.weight"], "dtypes": ["bfloat16"], "shapes": [[8, 8]]},
}
DISTRIBUTED_SIDECAR = {
    "weight_version": "v8",
    "method": "distributed",
    "group": {"init_info": {"master_address": "10.0.0.1", "master_port": 29500}},
    "update": {"update_infos": [{"names": ["a"]}, {"names": ["b"]}]},
}
TARGETS: dict[str, dict[str, Any]] = {
    "disk": DISK,
    "distributed-flat": DISTRIBUTED_FLAT,
    "distributed-sidecar": DISTRIBUTED_SIDECAR,
    "lora-load": {
        "weight_version": "v9",
        "method": "lora",
        "lora": {"action": "load", "lora_name": "policy-a", "uri": "s3://ckpt/a/1"},
    },
    "lora-swap": {
        "weight_version": "v9",
        "method": "lora",
        "lora": {"action": "swap", "lora_name": "policy-a", "uri": "s3://ckpt/a/2"},
    },
    "lora-unload": {
        "weight_version": "v9",
        "method": "lora",
        "lora": {"action": "unload", "lora_name": "policy-a"},
    },
    "tensor": {
        "weight_version": "v10",
        "method": "tensor",
        "update": {"serialized_named_tensors": ["abc"], "flush_cache": False},
    },
    "custom": {
        "weight_version": "v11",
        "method": "custom",
        "route": "control/update_weights_from_disk",
        "body": {"model_path": "/ckpt/v11"},
    },
}
VERIFICATIONS: dict[str, dict[str, Any] | None] = {
    "default": None,
    "no-generation": {"generation": False},
    "readback-only": {"generation": False, "liveness": False},
    "expected-model": {"expected_model": "served-name", "max_tokens": 16},
}
FINGERPRINT = {"completion_token_ids": [1, 2, 3], "prompt_token_ids": [9, 9]}


def _all_routes(family_name: str) -> list[str]:
    """Every route the family knows, so each operation is possible."""
    family = FAMILIES[family_name]
    return sorted({route for routes in family.routes.values() for route in routes})


def _workers() -> Iterator[tuple[str, Worker]]:
    advertised = {"vllm": VLLM_ROUTES, "vllm-sidecar": SIDECAR_ROUTES}
    for name in ("vllm", "vllm-sidecar"):
        full = _all_routes(name)
        yield f"{name}/usual", discovered(name, advertised[name])
        yield f"{name}/full", discovered(name, full)
        for route in full:
            yield f"{name}/without-{route}", discovered(name, [r for r in full if r != route])
    yield "sglang/usual", sglang_static_worker()
    full = _all_routes("sglang")
    yield "sglang/full", sglang_static_worker(full)
    for route in full:
        yield f"sglang/without-{route}", sglang_static_worker([r for r in full if r != route])
    yield "sglang/bound-flush", sglang_static_worker([*SGLANG_ROUTES, "flush=flush_cache:engine"])
    yield "sglang/bad-binding", sglang_static_worker([*SGLANG_ROUTES, "flush=nope:x:y"])
    yield "no-family/by-routes", discovered("", VLLM_ROUTES)
    yield "no-family/unknown", discovered("", ["something_else"])
    yield "vllm/erroring", discovered("vllm", VLLM_ROUTES, state=WorkerState.ERRORING, error="")
    yield "vllm/probe-error", discovered("vllm", VLLM_ROUTES, error="connection refused")
    yield "vllm/no-system-url", discovered("vllm", VLLM_ROUTES, system_url="")
    yield "vllm/outside", discovered("vllm", VLLM_ROUTES, system_url="http://192.168.1.2:9090")
    yield "vllm/no-world-size", discovered("vllm", VLLM_ROUTES, world_size=None)
    yield "vllm/no-model", discovered("vllm", VLLM_ROUTES, model="")
    yield "vllm/tp4", discovered("vllm", VLLM_ROUTES, world_size=4)


def _plan_of(
    worker: Worker,
    target: dict[str, Any],
    *,
    pause_mode: str,
    flush_policy: str,
    verification: dict[str, Any] | None,
    fingerprint: dict[str, Any] | None,
    pause_modes: dict[str, str] | None = None,
) -> dict[str, Any]:
    target = normalize_target(target)
    rank = world = None
    if target["method"] == "distributed" and worker.world_size:
        rank, world = (3, worker.world_size), 3 + worker.world_size + 2
    plan = plan_worker(
        worker,
        target=target,
        pause_mode=pause_mode,
        pause_modes=pause_modes,
        flush_policy=flush_policy,
        verification=normalize_verification(verification),
        policy=POLICY,
        fingerprint=normalize_fingerprint(fingerprint),
        rank=rank,
        group_world_size=world,
    )
    stored = dataclasses.asdict(dataclasses.replace(plan, worker=None))
    stored.pop("worker")
    return stored


def _settings(rich: bool) -> Iterator[tuple[str, dict[str, Any]]]:
    """Plan settings: the whole product for a worker with its usual or full routes, the defaults
    (and the flush forced) for one that misses a route."""
    for pause_mode in PAUSE_MODE_CHOICES if rich else ("auto",):
        for flush_policy in ("auto", "always"):
            yield (
                f"pause={pause_mode} flush={flush_policy}",
                {
                    "pause_mode": pause_mode,
                    "flush_policy": flush_policy,
                    "verification": None,
                    "fingerprint": None,
                },
            )
    if not rich:
        return
    for verification_name, verification in VERIFICATIONS.items():
        for fingerprint in (None, FINGERPRINT):
            if fingerprint and verification and verification.get("generation") is False:
                continue
            yield (
                f"verify={verification_name} fingerprint={'yes' if fingerprint else 'no'}",
                {
                    "pause_mode": "auto",
                    "flush_policy": "auto",
                    "verification": verification,
                    "fingerprint": fingerprint,
                },
            )
    # A per-family pause mode overrides the plan-wide one.
    for family_name in FAMILIES:
        yield (
            f"pause=keep pause_modes={family_name}:auto",
            {
                "pause_mode": "keep",
                "flush_policy": "auto",
                "verification": None,
                "fingerprint": None,
                "pause_modes": {family_name: "auto"},
            },
        )


def plans_of_the_fleet() -> dict[str, dict[str, Any]]:
    """Every case's plan, keyed by a name that says what varies."""
    out: dict[str, dict[str, Any]] = {}
    for worker_name, worker in _workers():
        rich = worker_name.endswith(("/usual", "/full"))
        for target_name, target in TARGETS.items():
            for settings_name, settings in _settings(rich):
                out[f"{worker_name} {target_name} {settings_name}"] = _plan_of(
                    worker, target, **settings
                )
    return out


def digest(plan: dict[str, Any]) -> str:
    """A short fingerprint of one plan: the golden file keeps these, not the plans themselves
    (thousands of plans with their request bodies would weigh megabytes)."""
    return hashlib.sha256(json.dumps(plan, sort_keys=True).encode()).hexdigest()[:16]


def _lines(digests: dict[str, str]) -> str:
    """One case per line, so a change of the plans reads as a diff naming the cases it changed."""
    rows = [f"{json.dumps(key)}: {json.dumps(digests[key])}" for key in sorted(digests)]
    return "{\n" + ",\n".join(rows) + "\n}\n"


def test_plans_of_a_varied_fleet_match_the_recorded_golden_file():
    plans = plans_of_the_fleet()
    digests = {key: digest(plan) for key, plan in plans.items()}
    if os.environ.get("UPDATE_PLAN_GOLDEN"):
        GOLDEN.write_text(_lines(digests))
    golden = json.loads(GOLDEN.read_text())
    assert sorted(digests) == sorted(golden)
    differing = [key for key in sorted(golden) if digests[key] != golden[key]]
    assert not differing, (
        f"{len(differing)} of {len(golden)} plans differ; the first, as planned now: "
        + json.dumps({key: plans[key] for key in differing[:2]}, indent=1)
    )


def test_the_fleet_covers_every_kind_of_blocker_and_plan():
    """Guards the guard: a golden file of blocked plans only would pin little."""
    plans = plans_of_the_fleet().values()
    blockers = {b.split(":")[0] for plan in plans for b in plan["blockers"]}
    assert {"probe error", "update", "pause", "verify", "route allowlist"} <= blockers
    clean = [plan for plan in plans if not plan["blockers"]]
    assert {plan["family"] for plan in clean} == set(FAMILIES)
    assert {plan["update_method"] for plan in clean} == {
        "disk",
        "distributed",
        "lora",
        "tensor",
        "custom",
    }
    assert any(plan["flush_skipped"] for plan in clean)
    assert any(plan["rank_offset"] == 3 for plan in clean)
    assert any(plan["calls"]["verify"][-1].get("fingerprint") for plan in clean)
