"""`manage.py refresh ...`: every policy refresh action from the command line, as a named user,
through the action table (permission, audit under that user), with documented exit codes and
`--json` for scripts."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command

from controlplane.accounts.management.commands._cli import Exit
from controlplane.audit.models import AuditEvent
from controlplane.refresh.models import Gate, GateState, PolicyRefresh, RefreshState
from controlplane.simfleet import Fault
from tests.integration.refresh.cli import cli, cli_json
from tests.integration.refresh.helpers import (
    fleet_config,
    fleet_versions,
    make_source,
    plan,
    sync_workers,
)

#: Every key `status --json` answers with (docs/operate/refresh-cli.md).
STATUS_KEYS = {
    "ok",
    "refresh",
    "state",
    "phase",
    "stopped",
    "elapsed_seconds",
    "progress",
    "steps",
    "workers",
    "namespaces",
    "eta",
}
#: The API's keys for one refresh (`RefreshOut`), which the CLI prints as they are.
REFRESH_KEYS = {
    "id",
    "source",
    "namespaces",
    "target",
    "state",
    "pause_mode",
    "pause_modes",
    "inflight_may_straddle",
    "group",
    "compat",
    "fingerprint",
    "strategy",
    "instances",
    "wave",
    "waves",
    "canary",
    "external",
    "plan_blockers",
    "failed_step",
    "held_reason",
    "end_reason",
    "requested_by",
    "approved_by",
    "rollback_of",
    "created_at",
    "started_at",
    "finished_at",
}
PLAN = ("--weight-version", "v5", "--model-path", "/ckpt/v5")


@pytest.fixture
def fleet(simfleet_factory):
    return simfleet_factory(fleet_config(3))


@pytest.fixture
def source(fleet, db):
    source = make_source(fleet)
    sync_workers(source)
    return source


def audited(action: str, refresh_id: int) -> list[AuditEvent]:
    return list(
        AuditEvent.objects.filter(action=action, correlation_id=f"policy-refresh-{refresh_id}")
    )


# -- plan, start, watch, status: the happy path with a real Celery worker -----------------------


def test_plan_start_and_watch_run_the_refresh_through_celery_as_the_named_user(
    fleet, source, operator, celery_worker
):
    code, planned = cli_json("refresh", "plan", "sim", *PLAN, "--as", operator.username)
    assert code == Exit.OK and planned["ok"] is True and planned["blockers"] == []
    assert set(planned["refresh"]) == REFRESH_KEYS
    pk = planned["refresh"]["id"]
    assert planned["refresh"]["state"] == "planned"
    assert planned["refresh"]["requested_by"] == operator.username
    assert audited("policy_refresh.planned", pk)[0].actor_user_id == operator.pk

    code, out, _ = cli(
        "refresh", "start", str(pk), "--as", operator.username, "--watch", "--interval", "0.1"
    )
    assert code == Exit.OK, out
    lines = out.splitlines()
    assert lines[0].startswith("Policy refresh started.") and "(by operator-1, audited)" in lines[0]
    # Not a terminal: one progress line per change, each with a plain-text bar, ending full.
    progress = [line for line in lines if line.startswith(f"#{pk} ")]
    assert len(progress) >= 2 and all("[" in line and "%" in line for line in progress)
    assert "[" + "#" * 24 + "] 100%" in progress[-1]
    assert lines[-1] == f"policy refresh #{pk} succeeded at v5"
    assert set(fleet_versions(fleet).values()) == {"v5"}
    [started] = audited("policy_refresh.started", pk)
    assert started.actor_label == operator.username and started.actor_user_id == operator.pk

    code, status = cli_json("refresh", "status", str(pk))
    assert code == Exit.OK and set(status) == STATUS_KEYS
    assert status["state"] == "succeeded" and status["stopped"] is True
    assert status["progress"]["fraction"] == 1.0 and status["progress"]["steps_done"] == 8
    assert status["workers"]["total"] == 3
    assert status["workers"]["by_step"]["verify"] == {"ok": 3}
    assert status["workers"]["by_step"]["update"] == {"ok": 3}
    assert {s["name"] for s in status["steps"] if s["status"] == "ok"} >= {"gate", "verify"}
    by_namespace = {ns["namespace"]: ns for ns in status["namespaces"]}
    assert set(by_namespace) == set(planned["refresh"]["namespaces"])
    assert all(ns["gate_state"] == "open" and not ns["held_here"] for ns in by_namespace.values())
    assert sum(ns["workers"] for ns in by_namespace.values()) == 3

    code, text, _ = cli("refresh", "status", str(pk))
    assert code == Exit.OK
    assert f"policy refresh #{pk}: sim" in text and "state: succeeded" in text
    assert "Update weights" in text and "verify          ok 3" in text

    # A refresh that already ran cannot start again: conflict, nothing audited.
    code, refused = cli_json("refresh", "start", str(pk), "--as", operator.username)
    assert code == Exit.CONFLICT
    assert refused["ok"] is False and refused["error"]["code"] == "invalid_transition"
    assert refused["error"]["exit"] == Exit.CONFLICT and "succeeded" in refused["error"]["message"]
    assert len(audited("policy_refresh.started", pk)) == 1


def test_a_held_refresh_is_watched_to_exit_1_then_retried_to_success(
    fleet, source, operator, celery_worker
):
    bad = fleet.workers()[0]["key"]
    fleet.inject(bad, "update_weights_from_disk", Fault.error("disk full", once=True))
    pk = plan(source, operator, "v5").pk
    code, out, _ = cli(
        "refresh", "start", str(pk), "--as", operator.username, "--watch", "--interval", "0.1"
    )
    assert code == Exit.FAILED
    assert out.splitlines()[-1].startswith(f"policy refresh #{pk} held: ")
    code, status = cli_json("refresh", "status", str(pk))
    assert status["state"] == "held" and status["refresh"]["failed_step"] == "update"
    assert status["workers"]["by_step"]["update"].get("failed") == 1
    assert sum(ns["failed_workers"] for ns in status["namespaces"]) == 1
    assert any(ns["held_here"] and ns["gate_state"] == "closed" for ns in status["namespaces"])

    # watch exits at once on a held refresh, with its outcome.
    code, out, _ = cli("refresh", "watch", str(pk), "--json", "--interval", "0.1")
    docs = [json.loads(line) for line in out.splitlines()]
    assert code == Exit.FAILED and len(docs) == 1 and docs[0]["state"] == "held"

    code, out, _ = cli(
        "refresh", "retry", str(pk), "--as", operator.username, "--watch", "--interval", "0.1"
    )
    assert code == Exit.OK, out
    assert out.splitlines()[-1] == f"policy refresh #{pk} succeeded at v5"
    assert audited("policy_refresh.retried", pk)[0].actor_label == operator.username
    assert set(fleet_versions(fleet).values()) == {"v5"}


def test_rollback_plans_a_new_refresh_to_the_last_verified_policy(
    fleet, source, operator, celery_worker
):
    first = plan(source, operator, "v5").pk
    assert cli("refresh", "start", str(first), "--as", operator.username, "--watch")[0] == 0
    fleet.inject(fleet.workers()[0]["key"], "update_weights_from_disk", Fault.error("bad ckpt"))
    second = plan(source, operator, "v6").pk
    assert cli("refresh", "start", str(second), "--as", operator.username, "--watch")[0] == 1

    fleet.clear_faults()
    code, rolled = cli_json("refresh", "rollback", str(second), "--as", operator.username)
    assert code == Exit.OK and rolled["action"] == "rollback"
    new = rolled["refresh"]
    assert new["id"] != second and new["rollback_of"] == second
    assert new["target"]["weight_version"] == "v5"
    assert PolicyRefresh.objects.get(pk=second).state == RefreshState.ROLLED_BACK
    assert audited("policy_refresh.rolled_back", second)[0].actor_user_id == operator.pk
    # The rollback runs (Celery) to the last verified policy; watch it through.
    code, out, _ = cli("refresh", "watch", str(new["id"]), "--interval", "0.1")
    assert code == Exit.OK and out.splitlines()[-1].endswith("succeeded at v5")
    assert set(fleet_versions(fleet).values()) == {"v5"}


# -- permissions, not found, usage: exit codes, and nothing changes -----------------------------


def test_refusals_have_distinct_exit_codes_and_change_nothing(source, operator, viewer):
    code, refused = cli_json("refresh", "plan", "sim", *PLAN, "--as", viewer.username)
    assert code == Exit.NOT_PERMITTED and refused["error"]["code"] == "not_permitted"
    assert "viewer-1 may not plan" in refused["error"]["message"]
    assert cli("refresh", "plan", "sim", *PLAN, "--as", "ghost")[0] == Exit.NOT_PERMITTED
    assert not PolicyRefresh.objects.exists()

    code, refused = cli_json("refresh", "plan", "nope", *PLAN, "--as", operator.username)
    assert code == Exit.NOT_FOUND and "no source named nope" in refused["error"]["message"]
    code, _, err = cli(
        "refresh", "plan", "sim", *PLAN, "--prompt-token-ids", "a,b", "--as", operator.username
    )
    assert code == Exit.USAGE and "invalid literal" in err
    assert not PolicyRefresh.objects.exists()

    pk = plan(source, operator).pk
    for verb, *extra in (
        ("start",),
        ("abort",),
        ("discard",),
        ("retry",),
        ("rollback",),
        ("resolve-membership",),
        ("reopen-verified",),
    ):
        code, _, err = cli("refresh", verb, str(pk), *extra, "--as", viewer.username)
        assert code == Exit.NOT_PERMITTED and "may not" in err, (verb, err)
    for verb, *extra in (
        ("approve",),
        ("reject", "--reason", "no"),
        ("end", "--reason", "no"),
        ("force-reopen", "--namespace", "rl-a", "--reason", "no"),
    ):
        code, _, err = cli("refresh", verb, str(pk), *extra, "--as", operator.username)
        needs = "force_reopen_gate" if verb == "force-reopen" else "approve_policy_refresh"
        assert code == Exit.NOT_PERMITTED and f"needs accounts.{needs}" in err, (verb, err)
    assert PolicyRefresh.objects.get(pk=pk).state == RefreshState.PLANNED
    assert not AuditEvent.objects.filter(action="policy_refresh.started").exists()

    for args in (
        ("status", "999999"),
        ("watch", "999999"),
        ("start", "999999", "--as", operator.username),
    ):
        code, refused = cli_json("refresh", *args)
        assert code == Exit.NOT_FOUND and refused["error"]["message"] == "no policy refresh #999999"


def test_actions_in_the_wrong_state_are_conflicts(source, operator, approver):
    pk = str(plan(source, operator).pk)
    for verb, *extra, who in (
        ("retry", operator),
        ("rollback", operator),
        ("resolve-membership", operator),
        ("reopen-verified", operator),
        ("approve", approver),
        ("reject", "--reason", "no", approver),
        ("end", "--reason", "no", approver),
    ):
        code, refused = cli_json("refresh", verb, pk, *extra, "--as", who.username)
        assert code == Exit.CONFLICT, (verb, refused)
        assert refused["error"]["code"] in {"invalid_transition", "approval_not_allowed"}
    assert PolicyRefresh.objects.get(pk=pk).state == RefreshState.PLANNED


def test_plan_takes_the_external_method_and_a_disk_plan_still_needs_its_path(source, operator):
    code, planned = cli_json(
        "refresh",
        "plan",
        "sim",
        "--weight-version",
        "v6",
        "--method",
        "external",
        "--apply-timeout",
        "45",
        "--as",
        operator.username,
    )
    assert code == Exit.OK, planned
    assert planned["refresh"]["target"] == {
        "weight_version": "v6",
        "method": "external",
        "apply_timeout_s": 45.0,
    }
    refresh = PolicyRefresh.objects.get(pk=planned["refresh"]["id"])
    assert {w.update_method for w in refresh.workers.all()} == {"external"}
    code, _, err = cli(
        "refresh", "plan", "sim", "--weight-version", "v7", "--as", operator.username
    )
    assert code == Exit.USAGE and "a disk update needs --model-path" in err


def test_a_usage_error_exits_2_from_the_command_line(source):
    from django.core.management import ManagementUtility

    for argv in (
        ["manage.py", "refresh", "start"],
        ["manage.py", "refresh", "reject", "1", "--as", "x"],  # --reason is required
        ["manage.py", "refresh", "frobnicate"],
    ):
        with pytest.raises(SystemExit) as exited:
            ManagementUtility(argv).execute()
        assert exited.value.code == Exit.USAGE


# -- discard, approval and the approver's actions -----------------------------------------------


def test_discard_ends_a_planned_refresh_audited_and_only_from_planned(source, operator, viewer):
    pk = plan(source, operator).pk
    assert cli("refresh", "discard", str(pk), "--as", viewer.username)[0] == Exit.NOT_PERMITTED
    code, out, _ = cli(
        "refresh", "discard", str(pk), "--reason", "wrong checkpoint", "--as", operator.username
    )
    assert code == Exit.OK and "Plan discarded" in out and "now aborted" in out
    refresh = PolicyRefresh.objects.get(pk=pk)
    assert refresh.state == RefreshState.ABORTED and refresh.finished_at is not None
    assert refresh.end_reason == "plan discarded by operator-1: wrong checkpoint"
    [event] = audited("policy_refresh.discarded", pk)
    assert event.actor_user_id == operator.pk and event.details["reason"] == "wrong checkpoint"

    code, refused = cli_json("refresh", "discard", str(pk), "--as", operator.username)
    assert code == Exit.CONFLICT and "only a planned refresh" in refused["error"]["message"]
    assert len(audited("policy_refresh.discarded", pk)) == 1


def test_approval_is_four_eyes_and_a_rejection_needs_a_reason(
    source, operator, approver, admin_user
):
    source.require_approval = True
    source.save(update_fields=["require_approval"])
    pk = plan(source, admin_user).pk
    code, acted = cli_json("refresh", "start", str(pk), "--as", admin_user.username)
    assert code == Exit.OK and acted["refresh"]["state"] == "awaiting_approval"
    # Only a plan never started is discarded; a refresh awaiting approval is rejected instead.
    assert cli("refresh", "discard", str(pk), "--as", admin_user.username)[0] == Exit.CONFLICT

    # The requester may not approve their own refresh, whatever their role.
    code, refused = cli_json("refresh", "approve", str(pk), "--as", admin_user.username)
    assert code == Exit.NOT_PERMITTED and "requester" in refused["error"]["message"]
    code, refused = cli_json("refresh", "reject", str(pk), "--reason", " ", "--as", "approver-1")
    assert code == Exit.USAGE and refused["error"]["code"] == "invalid_input"
    assert PolicyRefresh.objects.get(pk=pk).state == RefreshState.AWAITING_APPROVAL

    code, out, _ = cli("refresh", "reject", str(pk), "--reason", "not today", "--as", "approver-1")
    assert code == Exit.OK and "now rejected" in out
    assert audited("policy_refresh.rejected", pk)[0].actor_user_id == approver.pk
    # watch of a rejected refresh ends at once with exit 1.
    code, out, _ = cli("refresh", "watch", str(pk))
    assert (
        code == Exit.FAILED and out.splitlines()[-1] == f"policy refresh #{pk} rejected: not today"
    )


def test_watch_times_out_with_exit_6_printing_one_line_per_change(source, operator):
    pk = plan(source, operator).pk
    code, out, _ = cli("refresh", "watch", str(pk), "--interval", "0.05", "--timeout", "0.2")
    assert code == Exit.TIMED_OUT
    lines = out.splitlines()
    # Nothing changes on a planned refresh: one progress line, then the verdict.
    assert len(lines) == 2 and lines[0].startswith(f"#{pk} planned") and "0%" in lines[0]
    assert lines[1] == f"policy refresh #{pk} still planned after 0.2 s"
    assert cli("refresh", "watch", str(pk), "--interval", "0")[0] == Exit.USAGE
    # Refused before acting: the refresh is not started with a watch that cannot run.
    code, _, err = cli(
        "refresh", "start", str(pk), "--as", operator.username, "--watch", "--timeout", "-1"
    )
    assert code == Exit.USAGE and "--timeout" in err
    assert PolicyRefresh.objects.get(pk=pk).state == RefreshState.PLANNED


def test_list_filters_and_prints_the_api_keys(source, operator):
    first, second = plan(source, operator, "v5").pk, plan(source, operator, "v6").pk
    cli("refresh", "discard", str(first), "--as", operator.username)
    code, listed = cli_json("refresh", "list")
    assert code == Exit.OK and [r["id"] for r in listed["refreshes"]] == [second, first]
    assert all(set(r) == REFRESH_KEYS for r in listed["refreshes"])
    code, listed = cli_json("refresh", "list", "--state", "planned")
    assert [r["id"] for r in listed["refreshes"]] == [second]
    assert cli_json("refresh", "list", "--source", "other")[1]["refreshes"] == []
    code, text, _ = cli("refresh", "list", "--limit", "1")
    assert text.splitlines()[0].split()[:5] == ["ID", "SOURCE", "NAMESPACES", "VERSION", "STATE"]
    assert text.splitlines()[1].split()[0] == str(second) and len(text.splitlines()) == 2


# -- a held refresh's way out for an approver: force-reopen one namespace, end ------------------


def test_force_reopen_and_end_a_held_refresh_as_an_approver(
    fleet, source, operator, approver, celery_worker
):
    bad = next(w for w in fleet.workers() if w["namespace"] == "rl-a")["key"]
    fleet.inject(bad, "update_weights_from_disk", Fault.error("disk full"))
    pk = plan(source, operator, "v5").pk
    assert cli("refresh", "start", str(pk), "--as", operator.username, "--watch")[0] == 1
    namespaces = PolicyRefresh.objects.get(pk=pk).namespaces
    assert len(namespaces) >= 2

    code, out, _ = cli(
        "refresh",
        "force-reopen",
        str(pk),
        "--namespace",
        "rl-a",
        "--reason",
        "eval needs it",
        "--as",
        approver.username,
        "--watch",
        "--interval",
        "0.1",
    )
    assert code == Exit.FAILED  # still held for the other namespaces
    assert out.startswith("Gate force-reopened for that namespace")
    gate = Gate.objects.get(source=source, namespace="rl-a")
    assert gate.state == GateState.OPEN_FORCED and gate.forced_by == approver.username

    code, acted = cli_json(
        "refresh", "end", str(pk), "--reason", "give up", "--as", approver.username
    )
    assert code == Exit.OK and acted["refresh"]["state"] == "aborted"
    assert "give up" in acted["refresh"]["end_reason"]
    assert audited("policy_refresh.ended", pk)[0].actor_user_id == approver.pk


def test_a_blocked_plan_exits_1_and_cannot_start_and_a_busy_scope_is_a_conflict(
    fleet, source, operator
):
    key = fleet.workers()[0]["key"]
    descriptor = fleet.call(lambda: fleet.fleet.get(key).descriptor())
    descriptor["routes"] = [r for r in descriptor["routes"] if r != "update_weights_from_disk"]
    fleet.inject(key, "probe", Fault.reply(descriptor, once=True))
    code, blocked = cli_json("refresh", "plan", "sim", *PLAN, "--as", operator.username)
    assert code == Exit.FAILED and blocked["ok"] is False
    assert any(
        "needs update_weights_from_disk, which the worker does not advertise" in b
        for b in blocked["blockers"]
    )
    code, refused = cli_json(
        "refresh", "start", str(blocked["refresh"]["id"]), "--as", "operator-1"
    )
    assert code == Exit.CONFLICT and refused["error"]["code"] == "plan_blocked"

    # Two clean plans of one scope: the first start takes it, the second is a conflict.
    sync_workers(source)
    first, second = plan(source, operator).pk, plan(source, operator, "v6").pk
    assert cli("refresh", "start", str(first), "--as", operator.username)[0] == Exit.OK
    code, refused = cli_json("refresh", "start", str(second), "--as", operator.username)
    assert code == Exit.CONFLICT and refused["error"]["code"] == "refresh_conflict"
    assert f"policy refresh #{first}" in refused["error"]["message"]
    assert PolicyRefresh.objects.get(pk=second).state == RefreshState.PLANNED
    code, listed = cli_json("refresh", "list", "--active")
    assert [r["id"] for r in listed["refreshes"]] == [first]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_watch_on_a_terminal_redraws_one_line_in_place(source, operator):
    pk = plan(source, operator).pk
    out = Terminal()
    with pytest.raises(SystemExit) as exited:
        call_command(
            "refresh", "watch", str(pk), "--interval", "0.05", "--timeout", "0.1", stdout=out
        )
    assert exited.value.code == Exit.TIMED_OUT
    text = out.getvalue()
    assert text.startswith(f"\r\x1b[K#{pk} planned ") and "\n" not in text.split("\n")[0]
    assert text.endswith(f"\npolicy refresh #{pk} still planned after 0.1 s\n")
