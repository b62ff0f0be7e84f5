"""The README's "generate only on verified workers" example, run as written against a live
server and a simulated fleet refreshed to `step-1200`: every generation lands on a verified
worker. Only the three constants (server, frontend, token) are pointed at the test's."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

from controlplane.accounts.tokens import create_token
from controlplane.audit.recorder import Actor
from controlplane.refresh.models import Gate
from tests.integration.refresh.helpers import fleet_config, make_source, run_inline

README = Path(__file__).resolve().parents[3] / "README.md"


def readme_example() -> str:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("### Python: generate only on verified workers") :]
    return re.search(r"```python\n(.*?)```", section, re.S)[1]


def test_the_readme_pins_generations_to_verified_workers(
    simfleet_factory, operator, live_server_url
):
    fleet = simfleet_factory(fleet_config(6, model="policy"))
    source = make_source(fleet, name="prod-a")
    refresh = run_inline(source, operator, version="step-1200")
    assert refresh.state == "succeeded", refresh.held_reason
    gate = Gate.objects.get(source=source, namespace="rl-a")
    verified = {int(i) for i in gate.verified_instances}
    assert len(verified) == 2
    _, secret = create_token(user=operator, label="readme", actor=Actor.system("test"))

    code = readme_example()
    for name, value in {
        "BASE": live_server_url,
        "FRONTEND": fleet.frontend_url,
        "TOKEN": secret,
    }.items():
        code, count = re.subn(
            rf'^{name} = "[^"]*"', f"{name} = {json.dumps(value)}", code, count=1, flags=re.M
        )
        assert count == 1, f"the README example no longer defines {name}"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {"__name__": "readme"})

    lines = out.getvalue().splitlines()
    assert len(lines) == 2, lines
    for line in lines:
        ids, worker = line.split("] ", 1)
        assert ids.startswith("[") and len(ids) > 1  # completion ids came back
        served_by = json.loads(worker.replace("'", '"'))["decode_worker_id"]
        assert served_by in verified
