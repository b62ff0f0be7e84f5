"""`manage.py source ...` and `manage.py discover`."""

from __future__ import annotations

import io
import json
import re

import pytest
from django.core.management import CommandError, call_command

from controlplane.audit.models import AuditEvent
from controlplane.fleet.models import DiscoveryRun, Source, StaticWorker, Worker
from controlplane.intake.api.workers import DiscoveryRunOut, WorkerOut
from controlplane.intake.management.commands.discover import routes_summary
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
    assert source.discovery_interval_seconds == 5 and source.require_approval
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


def test_discover_prints_the_table_and_exits_zero(simfleet, make_source, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    make_source(simfleet)
    key = simfleet.workers()[0]["instance_id"]
    simfleet.set_version(key, "step-12")
    out = _run("discover", "sim")
    assert "listener namespace rl" in out
    assert "IDENTITY" in out and "VERSION" in out
    assert str(key) in out and "step-12" in out
    assert out.count("rl-a/") + out.count("rl-b/") >= 4
    # A wide terminal has room for every route: the count, then the names.
    worker = Worker.objects.get(instance_id=str(key))
    line = next(line for line in out.splitlines() if str(key) in line)
    assert f"{len(worker.routes)}: " + ",".join(worker.routes) in line


def test_discover_summarises_routes_to_the_terminal_width(simfleet, make_source, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    make_source(simfleet)
    out = _run("discover", "sim")
    rows = out.splitlines()[2:]
    assert len(rows) == 4 and max(len(line) for line in out.splitlines()[1:]) <= 100
    for row in rows:
        worker = Worker.objects.get(instance_id=row.split()[0].rsplit("/", 1)[-1])
        # The count, then the start of the real list, cut with an ellipsis.
        count, names = re.search(r" (\d+): (\S+)…", row).groups()
        assert int(count) == len(worker.routes) > 3
        assert ",".join(worker.routes).startswith(names)


def test_routes_summary_fits_its_width():
    routes = ["pause_generation", "resume_generation", "update_weights_from_disk"]
    assert routes_summary(routes, 200) == "3: " + ",".join(routes)
    assert routes_summary(routes, 20) == "3: pause_generation…"
    assert len(routes_summary(routes, 20)) == 20
    assert routes_summary([], 20) == "-"
    assert routes_summary(["a\x1b[2J"], 40) == "1: a\\u001b[2J"


def test_discover_json_has_the_api_keys_and_every_route(simfleet, make_source):
    make_source(simfleet)
    data = json.loads(_run("discover", "sim", "--json"))
    assert data["ok"] is True
    [source] = data["sources"]
    assert source["source"] == "sim" and source["ok"] is True
    assert set(source["run"]) == set(DiscoveryRunOut.model_fields)
    assert source["run"]["workers_total"] == 4 and len(source["workers"]) == 4
    for worker in source["workers"]:
        assert set(worker) == set(WorkerOut.model_fields)
        assert worker["routes"] == Worker.objects.get(pk=worker["id"]).routes


def test_discover_prints_a_failure_once_on_one_line(db, make_source, capsys, caplog):
    class Down:
        listener_url = closed_port_url()
        frontend_url = ""

    make_source(Down)
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(CommandError) as info:
        call_command("discover", "sim", stdout=out, stderr=err)
    assert info.value.returncode == 1
    message = str(info.value)
    assert "listener unreachable" in message and "\n" not in message
    printed = out.getvalue() + err.getvalue() + capsys.readouterr().err + message
    assert printed.count("listener unreachable") == 1
    assert out.getvalue().startswith("sim: listener failed (showing last known workers)")
    assert not [r for r in caplog.records if "listener unreachable" in r.getMessage()]
    # Still recorded like any discovery refresh.
    assert DiscoveryRun.objects.get().error.startswith("listener unreachable")

    # With --json: one document (ok false, the error in the run), exit 1, nothing else on stdout.
    out = io.StringIO()
    with pytest.raises(SystemExit) as exited:
        call_command("discover", "sim", "--json", stdout=out, stderr=io.StringIO())
    assert exited.value.code == 1
    [line] = out.getvalue().splitlines()
    data = json.loads(line)
    assert data["ok"] is False and "listener unreachable" in data["sources"][0]["run"]["error"]


def test_discover_unknown_source(db):
    with pytest.raises(CommandError, match="no source named") as info:
        _run("discover", "nope")
    assert info.value.returncode == 4


def test_discover_says_discovery_when_another_holds_the_source(db, make_source, monkeypatch):
    """The runner gives up waiting for a discovery another process holds (it returns None):
    the command speaks of discovery, not of a refresh, which here means a weight update."""

    class Down:
        listener_url = closed_port_url()
        frontend_url = ""

    make_source(Down)
    monkeypatch.setattr(
        "controlplane.intake.management.commands.discover.run_discovery",
        lambda *args, **kwargs: None,
    )
    out = io.StringIO()
    with pytest.raises(CommandError) as info:
        call_command("discover", "sim", stdout=out, stderr=io.StringIO())
    assert info.value.returncode == 1
    assert str(info.value) == "sim: another discovery held the source too long"
    assert out.getvalue().startswith("sim: not discovered (showing last known workers)")
    assert "refresh" not in out.getvalue() + str(info.value)


def test_source_max_lag_sets_the_policy_lag_policy_and_refuses_bad_input(db):
    _run(
        "source",
        "add",
        "lagged",
        "--listener-url",
        "http://127.0.0.1:9/",
        "--admin-network",
        "127.0.0.0/8",
    )
    source = Source.objects.get(name="lagged")
    assert (source.max_lag_action, source.max_lag_steps) == ("observe", 1)
    out = _run("source", "max-lag", "lagged", "--max-lag", "close", "--max-lag-steps", "2")
    assert "on policy lag close past 2 step(s)" in out
    source.refresh_from_db()
    assert (source.max_lag_action, source.max_lag_steps) == ("close", 2)
    assert AuditEvent.objects.filter(action="source.updated").exists()
    with pytest.raises(CommandError, match="max_lag_steps"):
        _run("source", "max-lag", "lagged", "--max-lag-steps", "-1")
    with pytest.raises(CommandError, match="give --max-lag"):
        _run("source", "max-lag", "lagged")
    source.refresh_from_db()
    assert (source.max_lag_action, source.max_lag_steps) == ("close", 2)
