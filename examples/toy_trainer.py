"""A toy RL training loop with no GPU: one complete iteration is policy refresh, then
post-update generation, then sample admission.

For each iteration k (3 by default) it:

1. announces checkpoint `step-k` (a signed `checkpoint.ready` webhook);
2. waits for the gate to be verified open at `step-k`;
3. generates a batch through the Dynamo frontend, each request pinned to an admitted instance,
   with token-id prompts and the engine's own token ids asked for;
4. admits every sample with the guard (`dynamo_rl_trainer.AdmissionGuard`);
5. checks that every admitted sample is stamped `step-k`, then moves on.

With `TOY_UPDATE_METHOD=external` (`Settings.update_method`) the trainer applies the weights
itself, as verl's CUDA IPC or NeMo RL's NCCL refit does: it announces the checkpoint with the
`external` update method, waits until the refresh has paused its workers
(`refresh.ready_for_apply`), loads the weights into each of them through the worker's own route
(the framework's transfer; here `update_weights_from_disk` on the simulated fleet, with no
version declared), reports `applied`, and waits for the gate as before: the control plane then
declares the version, reads it back, verifies and reopens.

The "training step" is a stand-in: it only counts tokens. Run it against `manage.py demo`
(docs/integrate/recipes/index.md) or any control plane, with:

    CONTROLPLANE_URL, CONTROLPLANE_TOKEN         the API and a viewer token
    TRAINER_ENDPOINT, TRAINER_SECRETS            the webhook endpoint, its secret(s) (a,b)
    CONTROLPLANE_SOURCE, CONTROLPLANE_NAMESPACE  the scope the trainer feeds
    DYNAMO_FRONTEND_URL, POLICY_MODEL            where rollouts are generated, and the model name
    TOY_ITERATIONS, TOY_BATCH                    optional: 3 iterations of 8 samples
    TOY_UPDATE_METHOD                            optional: disk (default) or external

It prints one JSON line per iteration. The tests run it (tests/integration/trainer).
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from dynamo_rl_trainer import (
    AdmissionGuard,
    ApplyRequest,
    Completion,
    ControlPlane,
    Frontend,
    GenerationError,
    Verdict,
)

#: The route each family loads a checkpoint through, under the worker's admin URL: what the
#: toy's "framework" calls to apply the weights itself in `external` mode.
LOAD_ROUTES = {
    "vllm": "engine/update_weights_from_disk",
    "sglang": "engine/control/update_weights_from_disk",
}


@dataclass
class Settings:
    control_url: str
    token: str
    endpoint: str
    secrets: list[str]
    source: str
    namespace: str
    frontend_url: str
    model: str
    iterations: int = 3
    batch: int = 8
    max_tokens: int = 8
    gate_timeout: float = 120.0
    generation_timeout: float = 30.0
    checkpoint_dir: str = "/checkpoints/toy"
    #: disk: the control plane loads the checkpoint on the workers; external: the trainer
    #: applies it itself and reports `applied`.
    update_method: str = "disk"
    #: external: how long the paused workers wait for the applied report.
    apply_timeout: float = 120.0

    @classmethod
    def from_env(cls) -> Settings:
        env = os.environ
        return cls(
            control_url=env["CONTROLPLANE_URL"],
            token=env["CONTROLPLANE_TOKEN"],
            endpoint=env["TRAINER_ENDPOINT"],
            secrets=env["TRAINER_SECRETS"].split(","),
            source=env["CONTROLPLANE_SOURCE"],
            namespace=env["CONTROLPLANE_NAMESPACE"],
            frontend_url=env["DYNAMO_FRONTEND_URL"],
            model=env["POLICY_MODEL"],
            iterations=int(env.get("TOY_ITERATIONS", "3")),
            batch=int(env.get("TOY_BATCH", "8")),
            update_method=env.get("TOY_UPDATE_METHOD", "disk"),
        )


def apply_through_worker_routes(request: ApplyRequest, model_path: str) -> None:
    """The framework's own transfer, stood in for: load the checkpoint into every paused worker
    through its own route, declaring no version (the control plane declares and checks it)."""
    for worker in request.workers:
        route = LOAD_ROUTES.get(worker.family)
        if route is None:
            raise SystemExit(f"no way to load weights into a {worker.family} worker")
        reply = httpx.post(
            f"{worker.system_url.rstrip('/')}/{route}", json={"model_path": model_path}, timeout=30
        )
        body = reply.json() if reply.status_code == 200 else {}
        if body.get("status") not in ("ok", "success") and body.get("success") is not True:
            raise SystemExit(f"loading {model_path} into {worker.key} failed: {reply.text[:200]}")


@dataclass
class Hooks:
    """Where a test (or a framework adapter) joins the loop."""

    #: Called before the iteration's checkpoint is announced.
    before_announce: Callable[[int], None] = lambda step: None
    #: Called once the gate admits the iteration's version, before generation.
    gate_open: Callable[[int, str], None] = lambda step, version: None
    #: Instances to sample from besides the admitted ones (a framework whose rollout pool is
    #: every discovered worker): the guard must refuse what they serve unless admitted.
    extra_instances: Callable[[int], list[int]] = lambda step: []
    #: `external` mode: apply the weights to the paused workers the refresh names.
    apply_weights: Callable[[ApplyRequest, str], None] = apply_through_worker_routes


@dataclass
class Iteration:
    step: int
    version: str
    refresh_id: int | None
    update_method: str = "disk"
    #: `external` mode: the workers the trainer applied the weights to.
    applied_to: list[int] = field(default_factory=list)
    admitted: list[Verdict] = field(default_factory=list)
    rejected: list[Verdict] = field(default_factory=list)
    completions: list[Completion] = field(default_factory=list)
    generation_errors: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        rules = Counter(rule for v in self.rejected for rule in v.failed_rules)
        served = Counter(
            str(c.reply["nvext"]["worker_id"]["decode_worker_id"]) for c in self.completions
        )
        return {
            "step": self.step,
            "version": self.version,
            "refresh_id": self.refresh_id,
            "update_method": self.update_method,
            "applied_to": len(self.applied_to),
            "admitted": len(self.admitted),
            "rejected": len(self.rejected),
            "rejected_rules": dict(rules),
            "served_by": dict(served),
            "retried_sends": sum(c.sends - 1 for c in self.completions),
            "generation_errors": self.generation_errors,
            "tokens_trained": sum(len(v.sample.completion_token_ids) for v in self.admitted),
        }


def prompt_for(step: int, index: int) -> list[int]:
    """A token-id prompt; a real trainer takes these from its dataset, already tokenized."""
    return [100 + step, 200 + index, 300, 400 + (index * 7) % 50]


# --8<-- [start:run_iteration]
def run_iteration(
    step: int,
    settings: Settings,
    control: ControlPlane,
    frontend: Frontend,
    guard: AdmissionGuard,
    hooks: Hooks,
) -> Iteration:
    version = f"step-{step}"
    path = f"{settings.checkpoint_dir}/{version}"
    hooks.before_announce(step)
    applied_to: list[int] = []
    if settings.update_method == "external":
        answer = control.announce_checkpoint(
            version, external={"apply_timeout_s": settings.apply_timeout}, step=step
        )
        started = control.wait_for_delivery(answer.webhook_id, settings.gate_timeout)
        if started.refresh_id is None:
            raise SystemExit(f"checkpoint {version} started no refresh: {started.outcome}")
        # The refresh paused the workers: apply the weights ourselves, then say so.
        request = control.wait_for_ready_for_apply(started.refresh_id, settings.gate_timeout)
        hooks.apply_weights(request, path)
        control.report_applied(started.refresh_id, version)
        applied_to = [w.instance_id for w in request.workers if w.instance_id is not None]
    else:
        answer = control.announce_checkpoint(version, model_path=path, step=step)
    control.wait_for_gate(version, settings.gate_timeout, checkpoint=answer)
    hooks.gate_open(step, version)
    delivery = control.delivery(answer.webhook_id)
    result = Iteration(
        step=step,
        version=version,
        refresh_id=delivery.refresh_id,
        update_method=settings.update_method,
        applied_to=applied_to,
    )

    view = control.admission_view()
    pool = [*control.admitted_instances().instance_ids]
    if not pool:
        raise SystemExit(f"the gate admits {version} but lists no instance to generate on")
    extra = [i for i in hooks.extra_instances(step) if i not in pool]
    for index in range(settings.batch + len(extra)):
        rollout = f"{version}/rollout-{index}"
        # Extra instances get one sample each, after the batch's own.
        targets = [extra[index - settings.batch]] if index >= settings.batch else pool
        completion = None
        for attempt in range(1, len(targets) + 1):
            instance = targets[(index + attempt - 1) % len(targets)]
            try:
                completion = frontend.pinned_completion(
                    prompt_for(step, index),
                    instance_id=instance,
                    policy_version=version,
                    rollout_id=rollout,
                    attempt_id=f"attempt-{attempt}",
                    max_tokens=settings.max_tokens,
                    timeout=settings.generation_timeout,
                )
                break
            except GenerationError as exc:
                # A refusal (an instance that left since the gate was read: 400) or no answer
                # after the client's retries: a *new* attempt, on the next admitted instance.
                result.generation_errors.append(f"{rollout} on {instance}: {exc}")
        if completion is None:
            continue
        result.completions.append(completion)
        verdict = guard.admit_completion(completion, view)
        (result.admitted if verdict.accepted else result.rejected).append(verdict)

    stamped = {v.sample.policy_version for v in result.admitted}
    if stamped - {version}:
        raise SystemExit(f"admitted samples stamped {stamped}, expected only {version}")
    return result


# --8<-- [end:run_iteration]


def train(settings: Settings, hooks: Hooks | None = None) -> list[Iteration]:
    hooks = hooks or Hooks()
    guard = AdmissionGuard()
    done = []
    with (
        ControlPlane(
            settings.control_url,
            source=settings.source,
            namespace=settings.namespace,
            endpoint=settings.endpoint,
            secrets=settings.secrets,
            token=settings.token,
        ) as control,
        Frontend(settings.frontend_url, model=settings.model) as frontend,
    ):
        for step in range(1, settings.iterations + 1):
            iteration = run_iteration(step, settings, control, frontend, guard, hooks)
            print(json.dumps(iteration.summary()), flush=True)
            done.append(iteration)
    return done


if __name__ == "__main__":
    train(Settings.from_env())
    sys.exit(0)
