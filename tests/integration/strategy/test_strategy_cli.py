"""`manage.py refresh plan --strategy ...`, `continue`, `approve-canary` and `reject-canary`:
a staged refresh driven from the command line through the action table rows, with a real
Celery worker, the documented exit codes and the strategy in `status`."""

from __future__ import annotations

import pytest
from django.core.management import ManagementUtility

from controlplane.accounts.management.commands._cli import Exit
from controlplane.refresh.models import PolicyRefresh, RefreshState
from tests.integration.refresh.cli import cli, cli_json
from tests.integration.refresh.helpers import (
    fleet_config,
    fleet_versions,
    make_source,
    run_inline,
    wait_for,
)

pytestmark = pytest.mark.celery

PLAN = ("refresh", "plan", "sim", "--weight-version", "v2", "--model-path", "/ckpt/v2")


@pytest.fixture
def fleet(simfleet_factory):
    return simfleet_factory(fleet_config(6))


@pytest.fixture
def source(fleet, operator, celery_worker):
    source = make_source(fleet)
    assert run_inline(source, operator, "v1").state == RefreshState.SUCCEEDED
    return source


def state_of(pk: int, state: str) -> bool:
    return PolicyRefresh.objects.get(pk=pk).state == state


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (("--strategy", "waves"), "waves need max_unavailable"),
        (("--strategy", "waves", "--max-unavailable", "1", "--canary", "2"), "need kind 'canary'"),
        (("--max-unavailable", "200%"), "not all_at_once"),
        (("--strategy", "waves", "--max-unavailable", "1", "--pause-after", "0"), "from 1"),
        (("--canary", "1", "--canary-instance", "7"), "not both"),
        (("--canary", "1", "--canary-analysis", "not a name!"), "analysis template's name"),
    ],
)
def test_a_strategy_that_does_not_validate_is_a_usage_error_and_plans_nothing(
    fleet, source, operator, options, message
):
    before = PolicyRefresh.objects.count()
    code, refused = cli_json(*PLAN, *options, "--as", operator.username)
    assert code == Exit.USAGE
    assert refused["error"]["code"] == "invalid_strategy"
    assert message in refused["error"]["message"]
    assert PolicyRefresh.objects.count() == before


def test_a_canary_approved_and_a_pause_point_continued_from_the_command_line(
    fleet, source, operator, viewer
):
    code, planned = cli_json(
        *PLAN,
        "--canary", "1",
        "--canary-evaluation", "manual",
        "--max-unavailable", "1",
        "--pause-after", "2",
        "--admit-as-verified",
        "--as", operator.username,
    )  # fmt: skip
    assert code == Exit.OK, planned
    refresh = planned["refresh"]
    pk = refresh["id"]
    assert refresh["strategy"]["kind"] == "canary"
    assert refresh["strategy"]["canary"] == {
        "size": 1,
        "evaluation": "manual",
        "timeout_seconds": 3600,
    }
    assert refresh["strategy"]["pause_after"] == [2]
    assert refresh["strategy"]["admit_as_verified"] is True
    assert refresh["waves"] == 3  # the canary, then two waves of one worker per namespace

    assert cli("refresh", "start", str(pk), "--as", operator.username)[0] == Exit.OK
    wait_for(lambda: state_of(pk, RefreshState.CANARY_REVIEW), timeout=60)
    code, text, _ = cli("refresh", "status", str(pk))
    assert "strategy: canary of 1 worker(s) approved by a person" in text
    assert "canary awaits a manual verdict until" in text

    # A viewer may not judge it; continuing is not what it waits for.
    assert cli("refresh", "approve-canary", str(pk), "--as", viewer.username)[0] == (
        Exit.NOT_PERMITTED
    )
    code, refused = cli_json("refresh", "continue", str(pk), "--as", operator.username)
    assert code == Exit.CONFLICT and refused["error"]["code"] == "invalid_transition"

    code, approved = cli_json(
        "refresh", "approve-canary", str(pk), "--as", operator.username, "--reason", "looks fine"
    )
    assert code == Exit.OK, approved
    assert approved["refresh"]["canary"]["verdict"] == "passed"
    wait_for(lambda: state_of(pk, RefreshState.WAITING), timeout=60)
    code, text, _ = cli("refresh", "status", str(pk))
    assert "waiting after wave 2 of 3 until continued" in text

    code, out, _ = cli(
        "refresh", "continue", str(pk), "--as", operator.username, "--watch", "--interval", "0.1"
    )
    assert code == Exit.OK, out
    assert out.splitlines()[-1] == f"policy refresh #{pk} succeeded at v2"
    assert set(fleet_versions(fleet).values()) == {"v2"}


def test_a_canary_rejected_from_the_command_line_is_rolled_back_and_holds(fleet, source, operator):
    chosen = sorted(str(w["instance_id"]) for w in fleet.workers())[0]
    code, planned = cli_json(
        *PLAN, "--canary-instance", chosen, "--canary-evaluation", "manual",
        "--as", operator.username,
    )  # fmt: skip
    assert code == Exit.OK, planned
    pk = planned["refresh"]["id"]
    assert planned["refresh"]["strategy"]["canary"]["instances"] == [chosen]
    assert cli("refresh", "start", str(pk), "--as", operator.username)[0] == Exit.OK
    wait_for(lambda: state_of(pk, RefreshState.CANARY_REVIEW), timeout=60)

    # A rejection needs a reason: without one the shell's exit is usage, and nothing changes.
    with pytest.raises(SystemExit) as exited:
        ManagementUtility(
            ["manage.py", "refresh", "reject-canary", str(pk), "--as", operator.username]
        ).execute()
    assert exited.value.code == Exit.USAGE
    assert state_of(pk, RefreshState.CANARY_REVIEW)
    code, out, _ = cli(
        "refresh", "reject-canary", str(pk), "--as", operator.username,
        "--reason", "reward fell", "--watch", "--interval", "0.1",
    )  # fmt: skip
    assert code == Exit.FAILED, out
    assert "held" in out.splitlines()[-1] and "reward fell" in out.splitlines()[-1]
    assert set(fleet_versions(fleet).values()) == {"v1"}
