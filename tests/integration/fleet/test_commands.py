"""`manage.py source ...` and `manage.py discover`."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from controlplane.audit.models import AuditEvent
from controlplane.fleet.models import Source, StaticWorker
from tests.integration.fleet.conftest import closed_port_url


def _run(*args) -> str:
    from io import StringIO

    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_source_add_list_remove(db):
    out = _run(
        "source",
        "add",
        "prod",
        "--listener-url",
        "http://10.0.0.5:8001",
        "--admin-network",
        "10.0.0.0/8",
        "--admin-network",
        "192.168.0.0/16",
        "--interval",
        "5",
        "--require-approval",
    )
    assert "created source prod" in out
    source = Source.objects.get(name="prod")
    assert source.allowed_networks == ["10.0.0.0/8", "192.168.0.0/16"]
    assert source.refresh_interval_seconds == 5 and source.require_approval
    assert AuditEvent.objects.filter(action="source.created", target_label="prod").exists()

    listing = _run("source", "list")
    assert "prod" in listing and "http://10.0.0.5:8001" in listing

    _run("source", "remove", "prod")
    assert not Source.objects.exists()
    assert AuditEvent.objects.filter(action="source.removed").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--listener-url", "ftp://10.0.0.5", "--admin-network", "10.0.0.0/8"], "HTTP or HTTPS"),
        (["--listener-url", "http://10.0.0.5:8001", "--admin-network", "10.0.0.0/33"], "CIDR"),
        (
            [
                "--listener-url",
                "http://10.0.0.5:8001",
                "--admin-network",
                "10.0.0.0/8",
                "--interval",
                "0.5",
            ],
            "at least 1",
        ),
        (["--listener-url", "http://10.0.0.5:8001"], "at least one CIDR"),
        (
            ["--listener-url", "http://10.9.9.9:8001", "--admin-network", "192.168.0.0/16"],
            "outside the allowed networks",
        ),
    ],
)
def test_source_add_rejects_bad_input_and_changes_nothing(db, args, message):
    with pytest.raises(CommandError, match=message):
        _run("source", "add", "bad", *args)
    assert not Source.objects.exists()
    assert not AuditEvent.objects.filter(action="source.created").exists()


def test_add_static_and_remove_static(db):
    _run(
        "source",
        "add",
        "s",
        "--listener-url",
        "http://10.0.0.5:8001",
        "--admin-network",
        "10.0.0.0/8",
    )
    _run(
        "source",
        "add-static",
        "s",
        "sg1",
        "--namespace",
        "rl-a",
        "--system-url",
        "http://10.0.0.7:9090",
        "--family",
        "sglang",
        "--route",
        "pause_generation",
        "--route",
        "continue_generation",
    )
    static = StaticWorker.objects.get(name="sg1")
    assert static.allowed_routes == ["continue_generation", "pause_generation"]
    with pytest.raises(CommandError, match="outside"):
        _run(
            "source",
            "add-static",
            "s",
            "sg2",
            "--namespace",
            "rl-a",
            "--system-url",
            "http://169.254.169.254",
            "--family",
            "sglang",
        )
    _run("source", "remove-static", "s", "sg1")
    assert not StaticWorker.objects.exists()


def test_discover_prints_the_table_and_exits_zero(simfleet, make_source):
    make_source(simfleet)
    key = simfleet.workers()[0]["instance_id"]
    simfleet.set_version(key, "step-12")
    out = _run("discover", "sim")
    assert "listener namespace rl" in out
    assert "IDENTITY" in out and "VERSION" in out
    assert str(key) in out and "step-12" in out
    assert "get_weight_version" in out
    assert out.count("rl-a/") + out.count("rl-b/") >= 4


def test_discover_fails_with_one_line_reason_when_listener_is_down(db, make_source):
    class Down:
        listener_url = closed_port_url()
        frontend_url = ""

    make_source(Down)
    with pytest.raises(CommandError) as info:
        _run("discover", "sim")
    assert "listener unreachable" in str(info.value)
    assert "\n" not in str(info.value)


def test_discover_unknown_source(db):
    with pytest.raises(CommandError, match="no source named"):
        _run("discover", "nope")
