"""`manage.py policy_refresh`: exit 0 on success, 1 when refused at plan time, 2 when held."""

from __future__ import annotations

import pytest
from django.core.management import call_command

from controlplane.simfleet import Fault
from tests.integration.refresh.helpers import (
    fleet_config,
    fleet_versions,
    make_source,
    sync_workers,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet(simfleet_factory):
    return simfleet_factory(fleet_config(3))


@pytest.fixture
def source(fleet):
    source = make_source(fleet)
    sync_workers(source)
    return source


def run(*args) -> int:
    try:
        call_command("policy_refresh", *args)
    except SystemExit as exc:
        return exc.code
    return 0


def test_command_succeeds_and_prints_the_plan(fleet, source, capsys):
    assert run("sim", "--version", "v5", "--model-path", "/ckpt/v5", "--yes") == 0
    out = capsys.readouterr().out
    assert "engine/update_weights_from_disk" in out and "succeeded at v5" in out
    assert "verify" in out
    assert set(fleet_versions(fleet).values()) == {"v5"}


def test_command_refuses_at_plan_time_when_a_worker_lacks_the_update_route(fleet, source, capsys):
    key = fleet.workers()[0]["key"]
    descriptor = fleet.call(lambda: fleet.fleet.get(key).descriptor())
    descriptor["routes"] = [r for r in descriptor["routes"] if r != "update_weights_from_disk"]
    fleet.inject(key, "probe", Fault.reply(descriptor))
    assert run("sim", "--version", "v5", "--model-path", "/ckpt/v5", "--yes") == 1
    captured = capsys.readouterr()
    assert "needs update_weights_from_disk, which the worker does not advertise" in captured.out
    assert "refused at plan time" in captured.err
    assert all(w["update_count"] == 0 for w in fleet.workers())


def test_command_exits_2_when_held(fleet, source, capsys):
    fleet.inject(fleet.workers()[0]["key"], "update_weights_from_disk", Fault.error("no space"))
    assert run("sim", "--version", "v5", "--model-path", "/ckpt/v5", "--yes") == 2
    assert "held at update" in capsys.readouterr().err
