"""verl skeleton: verl owns its colocated vLLM rollout workers, the trainer loop and the weight
transfer (CUDA IPC from the actor to the colocated engines). With the control plane that is the
`external` update method: it gates and pauses the workers, announces them
(`refresh.ready_for_apply`, or `wait_for_ready_for_apply`), waits for verl's `applied` report,
then declares the version, reads it back, verifies and reopens.

Run against `manage.py demo` (docs/integrate/recipes/index.md). The demo's simulated workers
stand in for verl's transfer: the skeleton loads the checkpoint through each paused worker's
own route, declaring no version. In verl this is where the rollout's weight sync runs (the
sharding manager handing CUDA IPC handles to the colocated engines).
"""

import os

import httpx
from common import control_plane, frontend, rollout_batch

STEP = int(os.environ.get("RECIPE_STEP", "1"))
VERSION = f"verl-step-{STEP}"


def sync_weights(workers, checkpoint: str) -> None:
    """Stand-in for verl's CUDA IPC weight sync into the colocated (paused) engines."""
    for worker in workers:
        url = f"{worker.system_url.rstrip('/')}/engine/update_weights_from_disk"
        reply = httpx.post(url, json={"model_path": checkpoint}, timeout=60)
        reply.raise_for_status()


with control_plane() as control, frontend() as fe:
    # 1. Announce the step: the control plane gates and pauses the rollout workers.
    answer = control.announce_checkpoint(VERSION, external={"apply_timeout_s": 300}, step=STEP)
    delivery = control.wait_for_delivery(answer.webhook_id, timeout=120)
    request = control.wait_for_ready_for_apply(delivery.refresh_id, timeout=300)
    # 2. verl applies the weights itself to the workers named, then says so.
    sync_weights(request.workers, f"/checkpoints/verl/global_step_{STEP}/actor")
    control.report_applied(delivery.refresh_id, VERSION)
    # 3. The control plane declares the version, verifies and reopens: wait for the gate.
    control.wait_for_gate(VERSION, timeout=300, checkpoint=answer)
    # 4. verl's rollout: the shared Dynamo frontend, pinned to admitted instances; the guard
    #    stands where verl builds its DataProto from the rollout outputs.
    samples = rollout_batch(control, fe, VERSION, [[11, 12, 13, STEP], [21, 22, 23, STEP]])
