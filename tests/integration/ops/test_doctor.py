"""`manage.py doctor`: each check's verdict, and the exit code that scripts rely on."""

from __future__ import annotations

import json
import time
from io import StringIO

import pytest
from django.core.management import call_command

from controlplane.fleet.models import Source
from controlplane.ops import doctor, heartbeat
from controlplane.ops.tasks import beat_heartbeat

pytestmark = pytest.mark.django_db


def _doctor(*args: str) -> tuple[int, str]:
    out = StringIO()
    try:
        call_command("doctor", *args, stdout=out)
    except SystemExit as exc:
        return int(exc.code or 0), out.getvalue()
    return 0, out.getvalue()


def _findings(*only: str) -> list[dict]:
    args = [a for name in only for a in ("--only", name)]
    _, out = _doctor("--json", *args)
    return json.loads(out)


def test_no_worker_and_no_beat_exit_1_naming_both():
    code, out = _doctor("--only", "celery", "--only", "beat")
    assert code == 1
    rows = [line.split(None, 2) for line in out.splitlines()[1:3]]
    assert rows[0][:2] == ["celery", "FAIL"] and "no Celery worker answered" in rows[0][2]
    assert rows[1][:2] == ["beat", "FAIL"] and "no heartbeat ever" in rows[1][2]
    assert "2 problem(s)" in out


def test_beat_heartbeat_fresh_passes_and_stale_fails():
    beat_heartbeat()  # what beat's schedule runs through a worker
    assert _doctor("--only", "beat")[0] == 0
    heartbeat.touch(time.time() - heartbeat.stale_after_seconds() - 5)
    code, out = _doctor("--only", "beat")
    assert code == 1 and "beat is down" in out


def test_database_redis_and_settings_pass_on_a_healthy_test_setup():
    findings = _findings("settings", "database", "redis")
    assert {f["check"] for f in findings} == {"settings", "database", "redis"}
    assert [f for f in findings if f["status"] == "fail"] == []


def test_each_source_listener_is_checked_through_its_own_outbound_policy(simfleet):
    Source.objects.create(
        name="reachable", listener_url=simfleet.listener_url, allowed_networks=["127.0.0.0/8"]
    )
    Source.objects.create(
        name="outside-policy", listener_url=simfleet.listener_url, allowed_networks=["10.0.0.0/8"]
    )
    Source.objects.create(
        name="off",
        listener_url="http://10.9.9.9:8001",
        allowed_networks=["10.0.0.0/8"],
        enabled=False,
    )
    by_check = {f["check"]: f for f in _findings("sources")}
    assert by_check["source reachable"]["status"] == "ok"
    assert "4 worker(s)" in by_check["source reachable"]["detail"]
    assert by_check["source outside-policy"]["status"] == "fail"
    assert "outbound policy" in by_check["source outside-policy"]["detail"]
    assert by_check["source off"] == {
        "check": "source off",
        "status": "ok",
        "detail": "disabled: not checked",
    }


def test_clock_skew_beyond_half_the_webhook_window_fails(monkeypatch, settings):
    settings.WEBHOOK_TOLERANCE_SECONDS = 300
    monkeypatch.setattr(doctor, "_database_time", lambda: time.time() - 200)
    monkeypatch.setattr(doctor, "_redis_time", lambda: time.time() - 3)
    findings = _findings("clock")
    database, redis = findings
    assert database["status"] == "fail" and "signed webhooks will be refused" in database["detail"]
    assert redis["status"] == "warn"
    assert _doctor("--only", "clock")[0] == 1
    monkeypatch.setattr(doctor, "_database_time", time.time)
    assert _doctor("--only", "clock")[0] == 0  # a warning alone passes…
    assert _doctor("--only", "clock", "--strict")[0] == 1  # …unless --strict


@pytest.mark.celery
def test_a_running_worker_answers_the_celery_check(celery_worker):
    # The fixture does not wait for the worker's control channel (no ping check): wait for it
    # here, bounded, so what is tested is the doctor's report, not the worker's start-up time.
    from controlplane.celery import app

    deadline = time.monotonic() + 30
    while not app.control.ping(timeout=0.5):
        assert time.monotonic() < deadline, "the test worker never answered a ping"
    (finding,) = _findings("celery")
    assert finding["status"] == "ok" and finding["detail"].startswith("1 worker(s) answered")


def test_an_unwritable_anchor_directory_is_reported(settings, tmp_path):
    settings.AUDIT_ANCHOR_FILE = tmp_path / "missing-dir" / "audit-anchors.jsonl"
    findings = [f for f in _findings("settings") if "AUDIT_ANCHOR_FILE" in f["detail"]]
    assert [f["status"] for f in findings] == ["warn"]  # development; production fails
    settings.AUDIT_ANCHOR_FILE = tmp_path / "audit-anchors.jsonl"
    assert not [f for f in _findings("settings") if "AUDIT_ANCHOR_FILE" in f["detail"]]
