"""`manage.py drill`: exit codes as `manage.py refresh` has them, JSON keys, and --wait."""

from __future__ import annotations

import json

import pytest

from controlplane.accounts.management.commands._cli import Exit
from controlplane.refresh import intents
from controlplane.refresh.models import DrillRun
from tests.integration.drills.helpers import actor_for, verified_twice
from tests.integration.refresh.cli import cli, cli_json
from tests.integration.refresh.helpers import fleet_config, plan


@pytest.fixture
def fleet(simfleet_factory):
    return simfleet_factory(fleet_config(6))


@pytest.fixture
def source(fleet, operator):
    return verified_twice(fleet, operator)


@pytest.mark.django_db
def test_refusals_exit_with_the_refresh_commands_codes(fleet, source, operator, viewer):
    me = ("--as", operator.get_username())
    assert cli_json("drill", "nope", *me)[0] == Exit.NOT_FOUND
    code, doc = cli_json("drill", source.name, "--as", viewer.get_username())
    assert code == Exit.NOT_PERMITTED and doc["ok"] is False
    code, doc = cli_json("drill", source.name, "--count", "0", *me)
    assert code == Exit.USAGE and doc["error"]["code"] == "invalid_input"
    code, doc = cli_json("drill", source.name, "--instance", "12345", *me)
    assert code == Exit.USAGE and "12345" in doc["error"]["message"]
    assert cli("drill", source.name, "--wait", "--interval", "0", *me)[0] == Exit.USAGE

    source.require_approval = True
    source.save(update_fields=["require_approval"])
    waiting = plan(source, operator, "v3")
    intents.start_policy_refresh(waiting, actor=actor_for(operator), enqueue=False)
    code, doc = cli_json("drill", source.name, *me)
    assert code == Exit.CONFLICT and doc["error"]["code"] == "refresh_conflict"
    assert f"#{waiting.pk}" in doc["error"]["message"]
    assert not DrillRun.objects.exists()


@pytest.mark.django_db
def test_starting_prints_the_drill(fleet, source, operator, settings, monkeypatch):
    monkeypatch.setattr("controlplane.refresh.drills.runner.enqueue_drill", lambda *a, **k: None)
    code, doc = cli_json("drill", source.name, "--namespace", "rl-b", "--as", operator.username)
    assert code == Exit.OK and doc["ok"] is True
    drill = doc["drill"]
    assert drill["namespaces"] == ["rl-b"] and len(drill["instances"]) == 1
    assert drill["from_version"] == "v2" and drill["to_version"] == "v1"
    assert drill["outcome"] == "running" and drill["phase"] == "forward"
    assert DrillRun.objects.get(pk=drill["id"]).requested_by == operator


def test_wait_exits_zero_once_rollback_is_proven(fleet, source, operator, celery_worker):
    code, out, err = cli(
        "drill", source.name, "--as", operator.username, "--wait", "--timeout", "90", "--json"
    )
    assert code == Exit.OK, (out, err)
    started, ended = (json.loads(line) for line in out.strip().splitlines())
    assert started["drill"]["outcome"] == "running"
    assert ended["drill"]["outcome"] == "succeeded"
    assert ended["drill"]["forward_seconds"] > 0 and ended["drill"]["back_seconds"] > 0


def test_wait_exits_one_when_the_drill_fails(fleet, source, operator, celery_worker):
    from controlplane.simfleet import Fault

    for w in fleet.workers():
        fleet.inject(w["key"], "update_weights_from_disk", Fault.error("disk full"))
    code, out, _ = cli(
        "drill",
        source.name,
        "--namespace",
        "rl-c",
        "--as",
        operator.username,
        "--wait",
        "--timeout",
        "90",
    )
    assert code == Exit.FAILED
    assert "failed:" in out and "next:" in out and "roll it back" in out
