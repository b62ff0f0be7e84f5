"""The docs' "generate only on verified workers" example (`docs/examples/gate_pinning.py`), run
as the file it is, in its own process, against a live server and a simulated fleet refreshed to
`step-1200`: every generation lands on a verified worker. Only its three environment variables
(server, frontend, token) point at the test's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from controlplane.accounts.tokens import create_token
from controlplane.audit.recorder import Actor
from controlplane.refresh.models import Gate
from tests.integration.refresh.helpers import fleet_config, make_source, run_inline

EXAMPLE = Path(__file__).resolve().parents[3] / "docs" / "examples" / "gate_pinning.py"


def test_the_docs_example_pins_generations_to_verified_workers(
    simfleet_factory, operator, live_server_url
):
    fleet = simfleet_factory(fleet_config(6, model="policy"))
    source = make_source(fleet, name="prod-a")
    refresh = run_inline(source, operator, version="step-1200")
    assert refresh.state == "succeeded", refresh.held_reason
    gate = Gate.objects.get(source=source, namespace="rl-a")
    verified = {int(i) for i in gate.verified_instances}
    assert len(verified) == 2
    _, secret = create_token(user=operator, label="docs-example", actor=Actor.system("test"))

    env = {
        **os.environ,
        "CONTROLPLANE_URL": live_server_url,
        "DYNAMO_FRONTEND_URL": fleet.frontend_url,
        "CONTROLPLANE_TOKEN": secret,
    }
    run = subprocess.run(
        [sys.executable, str(EXAMPLE)], env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr

    lines = run.stdout.splitlines()
    assert len(lines) == 2, lines
    for line in lines:
        ids, worker = line.split("] ", 1)
        assert ids.startswith("[") and len(ids) > 1  # completion ids came back
        served_by = json.loads(worker.replace("'", '"'))["decode_worker_id"]
        assert served_by in verified
