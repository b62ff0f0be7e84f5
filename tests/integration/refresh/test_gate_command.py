"""`manage.py gate list|show|reopen`: reads what the gate API serves; reopen is the action
table's FORCE_REOPEN as the named user (permission-checked, audited); refusals exit with the
operator commands' codes (2 bad input, 3 not permitted, 4 not found, 5 conflict)."""

from __future__ import annotations

import io
import json
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from controlplane.accounts.management.commands._cli import Exit
from controlplane.audit.models import AuditEvent
from controlplane.fleet.models import Source
from controlplane.refresh.gates import serialize_gate
from controlplane.refresh.models import Gate, GateState


@pytest.fixture
def source(db):
    source = Source.objects.create(
        name="sim", listener_url="http://127.0.0.1:9/", allowed_networks=["127.0.0.0/8"]
    )
    Gate.objects.create(
        source=source,
        namespace="rl-a",
        state=GateState.OPEN,
        verified_version="v7",
        verified_instances=["12", "18446744073709551615"],
        unverified_count=1,
        drift=[{"key": "w-3", "instance_id": "99", "kind": "joined", "detail": ""}],
        since=timezone.now() - timedelta(minutes=5),
    )
    Gate.objects.create(
        source=source, namespace="rl-b", state=GateState.CLOSED, reason="held: \x1b[2Jboom"
    )
    return source


def gate(*args) -> str:
    out = io.StringIO()
    call_command("gate", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def refused(*args, code: Exit) -> str:
    with pytest.raises(CommandError) as caught:
        gate(*args)
    assert caught.value.returncode == code
    return str(caught.value)


def test_list_and_show_print_state_counts_since_and_reason(source):
    listing = gate("list").splitlines()
    assert listing[0].split() == [
        "SOURCE",
        "NAMESPACE",
        "STATE",
        "VERSION",
        "VERIFIED",
        "UNVERIFIED",
        "DRIFT",
        "SINCE",
    ]
    since = Gate.objects.get(namespace="rl-a").since.isoformat()
    assert listing[1].split() == ["sim", "rl-a", "open", "v7", "2", "1", "1", since]
    assert listing[2].split()[:3] == ["sim", "rl-b", "closed"]
    assert gate("list", "sim") == gate("list")

    shown = gate("show", "sim", "rl-a")
    assert "gate sim/rl-a: open (admits rollouts)" in shown
    assert "verified instances (2): 12, 18446744073709551615" in shown
    assert "unverified workers: 1" in shown
    assert "w-3 instance 99: joined" in shown
    assert f"since: {since}" in shown
    # A reason quoted from outside cannot drive the terminal.
    closed = gate("show", "sim", "rl-b")
    assert "\x1b" not in closed and "reason: held: \\u001b[2Jboom" in closed


def test_bad_input_exits_1_and_changes_nothing(source, approver):
    assert "no source named nope" in refused("list", "nope", code=Exit.NOT_FOUND)
    assert "has no gate for rl-z" in refused("show", "sim", "rl-z", code=Exit.NOT_FOUND)
    assert "no active user" in refused(
        "reopen", "sim", "rl-b", "--reason", "x", "--as", "ghost", code=Exit.NOT_PERMITTED
    )
    assert "reason" in refused(
        "reopen", "sim", "rl-b", "--reason", "  ", "--as", approver.username, code=Exit.USAGE
    )
    assert "already open" in refused(
        "reopen", "sim", "rl-a", "--reason", "x", "--as", approver.username, code=Exit.CONFLICT
    )
    assert Gate.objects.get(namespace="rl-b").state == GateState.CLOSED
    assert not AuditEvent.objects.filter(action="gate.force_reopened").exists()


def test_reopen_is_refused_for_a_viewer(source, viewer, operator):
    for user in (viewer, operator):
        message = refused(
            "reopen",
            "sim",
            "rl-b",
            "--reason",
            "go",
            "--as",
            user.username,
            code=Exit.NOT_PERMITTED,
        )
        assert "may not force-reopen" in message
    assert Gate.objects.get(namespace="rl-b").state == GateState.CLOSED
    assert not AuditEvent.objects.filter(action="gate.force_reopened").exists()


def test_reopen_as_an_approver_is_forced_and_audited_under_their_name(source, approver):
    out = gate("reopen", "sim", "rl-b", "--reason", "eval needs it", "--as", approver.username)
    assert "force-reopened: open_forced" in out
    reopened = Gate.objects.get(namespace="rl-b")
    assert reopened.state == GateState.OPEN_FORCED and reopened.reason == "eval needs it"
    assert reopened.forced_by == approver.username and reopened.forced_at is not None
    event = AuditEvent.objects.get(action="gate.force_reopened")
    assert event.actor_label == approver.username and event.actor_user_id == approver.pk
    assert event.details["reason"] == "eval needs it"
    assert "forced by approver-1 at " in gate("show", "sim", "rl-b")


def test_every_gate_verb_answers_json_with_the_gate_api_keys(source, approver):
    listed = json.loads(gate("list", "--json"))
    assert listed["ok"] is True
    assert [(g["source"], g["namespace"], g["state"]) for g in listed["gates"]] == [
        ("sim", "rl-a", "open"),
        ("sim", "rl-b", "closed"),
    ]
    api = serialize_gate(Gate.objects.get(namespace="rl-a"))
    shown = json.loads(gate("show", "sim", "rl-a", "--json"))
    assert shown["gate"] == json.loads(json.dumps(api, default=str))
    reopened = json.loads(
        gate("reopen", "sim", "rl-b", "--reason", "eval", "--as", approver.username, "--json")
    )
    assert reopened["gate"]["state"] == "open_forced" and reopened["gate"]["reason"] == "eval"
    out = io.StringIO()
    with pytest.raises(CommandError):
        call_command("gate", "show", "sim", "rl-z", "--json", stdout=out)
    assert json.loads(out.getvalue())["error"] == {
        "code": "not_found",
        "exit": Exit.NOT_FOUND,
        "message": "source sim has no gate for rl-z",
    }
