"""verl skeleton: verl owns its colocated vLLM rollout workers and the trainer loop; the
control plane gates rollouts on a verified policy and pins generation to admitted workers.

Run against `manage.py demo` (docs/integrate/recipes/index.md). verl's recipe applies weights
itself over CUDA IPC; until the control plane's `external` update method exists, the closest
runnable path is the `disk` method fed by verl's saved checkpoint (shown here).
"""

import os

from common import control_plane, frontend, rollout_batch

STEP = int(os.environ.get("RECIPE_STEP", "1"))
VERSION = f"verl-step-{STEP}"

with control_plane() as control, frontend() as fe:
    # 1. verl's trainer saved the actor's weights (checkpoint manager, HF format).
    checkpoint = f"/checkpoints/verl/global_step_{STEP}/actor/huggingface"
    # 2. Announce it: the control plane gates, pauses, updates, verifies, and reopens.
    answer = control.announce_checkpoint(VERSION, model_path=checkpoint, step=STEP)
    control.wait_for_gate(VERSION, timeout=300, checkpoint=answer)
    # 3. verl's rollout: the shared Dynamo frontend, pinned to admitted instances; the guard
    #    stands where verl builds its DataProto from the rollout outputs.
    samples = rollout_batch(control, fe, VERSION, [[11, 12, 13, STEP], [21, 22, 23, STEP]])
