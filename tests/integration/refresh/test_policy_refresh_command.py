"""`manage.py policy_refresh`: plan, start through the action table as the named user, and see
it through — exit 0 on success, 1 when refused at plan time or held, 3 when not permitted.

The executor runs in a thread of the command when no Celery worker takes it first (here: none
is running), so these tests use committed transactions."""

from __future__ import annotations

import io
import json

import django
import pytest
from django.core.management import ManagementUtility

from controlplane.accounts.management.commands._cli import Exit
from controlplane.audit.models import AuditEvent
from controlplane.refresh.models import PolicyRefresh, RefreshState
from controlplane.simfleet import Fault
from tests.integration.refresh.cli import cli
from tests.integration.refresh.helpers import (
    fleet_config,
    fleet_versions,
    make_source,
    sync_workers,
)

pytestmark = pytest.mark.django_db(transaction=True)
ARGS = ("sim", "--weight-version", "v5", "--model-path", "/ckpt/v5", "--yes")


@pytest.fixture
def fleet(simfleet_factory):
    return simfleet_factory(fleet_config(3))


@pytest.fixture
def source(fleet):
    source = make_source(fleet)
    sync_workers(source)
    return source


def test_command_succeeds_as_the_named_user_and_prints_plan_and_steps(fleet, source, operator):
    code, out, err = cli("policy_refresh", *ARGS, "--as", operator.username)
    assert code == Exit.OK, err
    assert "engine/update_weights_from_disk" in out and "verify" in out
    assert "  update          ok" in out and "  reopen          ok" in out
    assert out.splitlines()[-1].endswith("succeeded at v5")
    assert set(fleet_versions(fleet).values()) == {"v5"}
    refresh = PolicyRefresh.objects.get()
    assert refresh.requested_by == operator and refresh.lease_owner == ""
    for action in ("policy_refresh.planned", "policy_refresh.started"):
        event = AuditEvent.objects.get(action=action, correlation_id=refresh.correlation_id)
        assert event.actor_user_id == operator.pk


def test_command_answers_one_json_document(fleet, source, operator):
    code, out, _ = cli("policy_refresh", *ARGS, "--as", operator.username, "--json")
    assert code == Exit.OK
    [line] = out.splitlines()
    status = json.loads(line)
    assert status["ok"] is True and status["state"] == "succeeded"
    assert status["refresh"]["target"]["weight_version"] == "v5"


def test_command_refuses_a_viewer_and_plans_nothing(fleet, source, viewer):
    code, _, err = cli("policy_refresh", *ARGS, "--as", viewer.username)
    assert code == Exit.NOT_PERMITTED and "viewer-1 may not" in err
    assert not PolicyRefresh.objects.exists()


def test_command_refuses_at_plan_time_when_a_worker_lacks_the_update_route(fleet, source, operator):
    key = fleet.workers()[0]["key"]
    descriptor = fleet.call(lambda: fleet.fleet.get(key).descriptor())
    descriptor["routes"] = [r for r in descriptor["routes"] if r != "update_weights_from_disk"]
    fleet.inject(key, "probe", Fault.reply(descriptor))
    code, out, err = cli("policy_refresh", *ARGS, "--as", operator.username)
    assert code == Exit.FAILED
    assert "needs update_weights_from_disk, which the worker does not advertise" in out
    assert "refused at plan time" in err
    assert all(w["update_count"] == 0 for w in fleet.workers())


def test_command_exits_1_when_held(fleet, source, operator):
    fleet.inject(fleet.workers()[0]["key"], "update_weights_from_disk", Fault.error("no space"))
    code, _, err = cli("policy_refresh", *ARGS, "--as", operator.username)
    assert code == Exit.FAILED
    assert "held at update" in err and "no space" in err
    assert PolicyRefresh.objects.get().state == RefreshState.HELD


def test_version_stays_djangos_and_an_old_script_is_refused_not_fooled(source, capsys):
    # `--version` alone is Django's flag: it prints Django's version and exits 0.
    with pytest.raises(SystemExit) as exited:
        ManagementUtility(["manage.py", "policy_refresh", "--version"]).execute()
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == django.get_version()
    # With other arguments (an old `--version V` script) it is a usage error, never exit 0.
    argv = ["manage.py", "policy_refresh", "sim", "--version", "v5", "--model-path", "/c"]
    with pytest.raises(SystemExit) as exited:
        ManagementUtility(argv).execute()
    assert exited.value.code == Exit.USAGE
    assert "--weight-version" in capsys.readouterr().err
    assert not PolicyRefresh.objects.exists()


def test_declining_at_the_prompt_starts_nothing(fleet, source, operator, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("n\n"))
    code, out, err = cli("policy_refresh", *ARGS[:-1], "--as", operator.username)
    assert code == Exit.FAILED and "declined" in err
    assert "Start this refresh? [y/N]" in err and "Start this" not in out
    assert PolicyRefresh.objects.get().state == RefreshState.PLANNED
    assert all(w["update_count"] == 0 for w in fleet.workers())


def test_the_printed_plan_groups_workers_that_share_it(fleet, source, operator):
    # Three workers of one family share one plan: it prints once, with its count, and every
    # worker only when asked (a fleet of thousands stays readable).
    code, out, err = cli("policy_refresh", *ARGS, "--as", operator.username)
    assert code == Exit.OK, err
    assert "3 x [vllm]" in out
    assert out.count("engine/update_weights_from_disk") == 1
    assert "every worker:" not in out
    code, out, err = cli(
        "policy_refresh",
        "sim",
        "--weight-version",
        "v6",
        "--model-path",
        "/ckpt/v6",
        "--yes",
        "--workers",
        "--as",
        operator.username,
    )
    assert code == Exit.OK, err
    assert "every worker:" in out
    assert all(w.key in out for w in PolicyRefresh.objects.order_by("-pk").first().workers.all())
