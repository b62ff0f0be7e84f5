"""What every framework skeleton shares: the scope from the environment, and one batch of
rollouts pinned to admitted instances and admitted sample by sample by the guard.

Environment (the same as examples/toy_trainer.py): CONTROLPLANE_URL, CONTROLPLANE_TOKEN,
TRAINER_ENDPOINT, TRAINER_SECRETS, CONTROLPLANE_SOURCE, CONTROLPLANE_NAMESPACE,
DYNAMO_FRONTEND_URL, POLICY_MODEL.
"""

from __future__ import annotations

import os

from dynamo_rl_trainer import AdmissionGuard, ControlPlane, Frontend, Sample


def control_plane() -> ControlPlane:
    env = os.environ
    return ControlPlane(
        env["CONTROLPLANE_URL"],
        source=env["CONTROLPLANE_SOURCE"],
        namespace=env["CONTROLPLANE_NAMESPACE"],
        endpoint=env["TRAINER_ENDPOINT"],
        secrets=env["TRAINER_SECRETS"].split(","),
        token=env["CONTROLPLANE_TOKEN"],
    )


def frontend() -> Frontend:
    return Frontend(os.environ["DYNAMO_FRONTEND_URL"], model=os.environ["POLICY_MODEL"])


def rollout_batch(
    control: ControlPlane, fe: Frontend, version: str, prompts: list[list[int]]
) -> list[Sample]:
    """Generate one sample per prompt on the admitted instances, keep what the guard admits,
    and refuse to go on if an admitted sample is stamped with another version."""
    view = control.admission_view()
    instances = control.admitted_instances().instance_ids
    guard = AdmissionGuard()
    admitted = []
    for index, prompt in enumerate(prompts):
        completion = fe.pinned_completion(
            prompt,
            instance_id=instances[index % len(instances)],
            policy_version=version,
            rollout_id=f"{version}/{index}",
            attempt_id="1",
            max_tokens=16,
        )
        verdict = guard.admit_completion(completion, view)
        if verdict.accepted:
            admitted.append(verdict.sample)
        else:
            print(f"rejected {verdict.sample.key}: {verdict.failed_rules}")
    assert all(s.policy_version == version for s in admitted)
    print(f"{version}: {len(admitted)}/{len(prompts)} samples admitted ({view.__class__.__name__})")
    return admitted
