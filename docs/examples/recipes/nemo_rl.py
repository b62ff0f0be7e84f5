"""NeMo RL skeleton: NeMo RL's refit broadcasts new weights to its rollout workers over NCCL.
With the control plane that is the `distributed` update method: it forms the weight-update
group on the workers (`init_weights_update_group`), tells the trainer the group is ready, and
applies the weights once the trainer reports its broadcast (`broadcast.done`).

Against `manage.py demo` the simulated fleet stands in for the NCCL broadcast: set
`SIMFLEET_CONTROL_URL` to the fleet's control URL (the demo prints it). In NeMo RL this is
where the policy's `broadcast_weights_for_collective` runs.
"""

import os

import httpx
from common import control_plane, frontend, rollout_batch

STEP = int(os.environ.get("RECIPE_STEP", "1"))
VERSION = f"nemo-step-{STEP}"
GROUP = {"master_address": "127.0.0.1", "master_port": 29500, "group_name": "nemo-refit"}
UPDATE = {"names": ["lm_head.weight"], "dtypes": ["bfloat16"], "shapes": [[8, 8]]}


def broadcast(version: str) -> None:
    """Stand-in for the NCCL broadcast from the trainer's rank 0."""
    control_url = os.environ["SIMFLEET_CONTROL_URL"].rstrip("/")
    body = {"version": version, "group_name": GROUP["group_name"]}
    httpx.post(f"{control_url}/groups/broadcast", json=body, timeout=30).raise_for_status()


with control_plane() as control, frontend() as fe:
    answer = control.announce_checkpoint(
        VERSION, distributed={"group": GROUP, "update": UPDATE}, step=STEP
    )
    delivery = control.wait_for_delivery(answer.webhook_id, timeout=120)
    group = control.wait_for_group_ready(delivery.refresh_id, timeout=300)
    broadcast(VERSION)
    control.report_broadcast_done(
        delivery.refresh_id, weight_version=VERSION, attempt=group.attempt
    )
    control.wait_for_gate(VERSION, timeout=300, checkpoint=answer)
    samples = rollout_batch(control, fe, VERSION, [[71, 72, STEP], [81, 82, STEP]])
