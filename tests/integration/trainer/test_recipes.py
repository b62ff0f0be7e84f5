"""The docs' framework skeletons (docs/examples/recipes/*.py), each run as the file it is, in
its own process, against the live stack (web server and Celery worker processes over the
simulated fleet): each announces its checkpoint, waits for the gate, and admits its rollouts."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.trainer.harness import build_stack

pytestmark = pytest.mark.celery

ROOT = Path(__file__).resolve().parents[3]
RECIPES = ROOT / "docs" / "examples" / "recipes"
ADMITTED = re.compile(r"^(\S+): (\d+)/(\d+) samples admitted \((\w+)\)$", re.MULTILINE)


def run_skeleton(name: str, env: dict[str, str]) -> str:
    run = subprocess.run(
        [sys.executable, str(RECIPES / f"{name}.py")],
        env=env,
        cwd=RECIPES,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, f"{name}:\n{run.stdout}\n{run.stderr}"
    return run.stdout


def test_every_framework_skeleton_refreshes_then_admits_its_rollouts(
    simfleet_factory, operator, trainer_stack_url, transactional_db
):
    stack = build_stack(simfleet_factory, operator, trainer_stack_url)
    env = {
        **os.environ,
        **stack.env(),
        "PYTHONPATH": str(ROOT / "clients" / "python" / "src"),
        "SIMFLEET_CONTROL_URL": stack.fleet.control_url,
        "SLIME_ENGINE_URLS": ",".join(w["system_url"] for w in stack.fleet.workers()),
    }
    expected = {
        "verl": "verl-step-1",
        "nemo_rl": "nemo-step-1",
        "slime": "slime-rollout-1",
        "prime_rl": "prime-step-1",
    }
    for name, version in expected.items():
        out = run_skeleton(name, env)
        ((printed, admitted, asked, basis),) = ADMITTED.findall(out)
        assert (printed, admitted, asked) == (version, "2", "2"), out
        assert basis == "LedgerView"  # the server's serving ledger answers admission
        assert {w["version"] for w in stack.fleet.workers()} == {version}
        if name == "slime":
            assert f"{len(stack.fleet.workers())} healthy engine(s)" in out
