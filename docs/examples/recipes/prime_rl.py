"""Prime-RL skeleton: Prime-RL documents the Dynamo router as a drop-in for its inference
server, so rollouts can go through the Dynamo frontend today; worker discovery and external
updates are a proposed sidecar still in upstream development (not a released surface).

What runs here: the orchestrator's checkpoint is announced as a `disk` update, the control
plane verifies it, and rollouts go through the frontend pinned to admitted instances.
"""

import os

from common import control_plane, frontend, rollout_batch

STEP = int(os.environ.get("RECIPE_STEP", "1"))
VERSION = f"prime-step-{STEP}"

with control_plane() as control, frontend() as fe:
    # Prime-RL's trainer writes weights per step (`weights/step_<n>`); its orchestrator would
    # otherwise reload the inference server itself. Here the control plane does it, gated.
    answer = control.announce_checkpoint(
        VERSION, model_path=f"/outputs/weights/step_{STEP}", step=STEP
    )
    control.wait_for_gate(VERSION, timeout=300, checkpoint=answer)
    samples = rollout_batch(control, fe, VERSION, [[31, 32, STEP], [41, 42, STEP]])
