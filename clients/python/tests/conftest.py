"""Shared helpers: the stored real replies (captured from the simulated fleet's frontend and
from the real Dynamo 1.6.1 frontend by the project's integration and interop tests)."""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

# CI tests the installed package (a fresh venv, `pip install ./clients/python`); from a
# checkout without it installed (the project's own venv), the source tree stands in.
if importlib.util.find_spec("dynamo_rl_trainer") is None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from dynamo_rl_trainer import Gate, GateView, GenerationRequest
from dynamo_rl_trainer.results import AdmittedInstances, WorkerIdentity

FIXTURES = Path(__file__).parent / "fixtures"
REPLY_FIXTURES = sorted(p.stem for p in FIXTURES.glob("*.json"))


class Captured:
    """One stored request/reply pair, and a gate view that admits its serving instance."""

    def __init__(self, name: str) -> None:
        data = json.loads((FIXTURES / f"{name}.json").read_text())
        self.name = name
        raw = dict(data["request"])
        raw["prompt_token_ids"] = tuple(raw["prompt_token_ids"])
        self.request = GenerationRequest(**raw)
        self.reply: dict[str, Any] = data["reply"]

    def fresh_reply(self) -> dict[str, Any]:
        return copy.deepcopy(self.reply)

    def view(
        self,
        *,
        version: Any = None,
        instances: tuple[int, ...] | None = None,
        since: float | None = None,
        model: str | None = None,
        state: str = "open",
    ) -> GateView:
        iid = self.request.instance_id
        listed = instances if instances is not None else (iid,)
        gate = Gate(
            source="sim",
            namespace="rl-a",
            state=state,
            open=state.startswith("open"),
            verified_version=self.request.policy_version if version is None else version,
            verified_instances=listed,
            since=self.request.sent_at - 60 if since is None else since,
            reason="",
            revision=3,
            active_refresh_id=None,
        )
        identities = tuple(
            WorkerIdentity(instance_id=i, namespace="rl-a", model=model or self.request.model)
            for i in listed
        )
        return GateView(AdmittedInstances(gate=gate, instances=identities))


@pytest.fixture(params=REPLY_FIXTURES)
def captured(request: pytest.FixtureRequest) -> Captured:
    return Captured(request.param)
