"""A shell beside a running demo uses the demo's Redis and database (controlplane/runtime.py):
settings read `<VAR_DIR>/demo-runtime.json` when the environment does not say otherwise, ignore
a file whose demo is gone, and every command says so when it uses something else."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from controlplane import runtime

ROOT = Path(__file__).resolve().parents[2]
DEMO_REDIS = "redis://127.0.0.1:45678/0"
DEMO_DB = "postgres://demo:s3cret@127.0.0.1:5432/demo_db"

SHOW_SETTINGS = """
import json, django
django.setup()
from django.conf import settings
db = settings.DATABASES["default"]
print(json.dumps({
    "redis": settings.REDIS_URL,
    "broker": settings.CELERY_BROKER_URL,
    "cache": settings.CACHES["default"]["LOCATION"],
    "prefix": settings.REDIS_KEY_PREFIX,
    "db": [db["ENGINE"], db["NAME"], db.get("HOST", ""), str(db.get("PORT", ""))],
    "notice": settings.RUNTIME_NOTICE,
}))
"""


def _environ(var_dir: Path, **extra: str) -> dict[str, str]:
    skip = {"REDIS_URL", "DATABASE_URL", "REDIS_KEY_PREFIX", "DJANGO_SETTINGS_MODULE"}
    environ = {k: v for k, v in os.environ.items() if k not in skip}
    environ.update(
        CONTROLPLANE_VAR_DIR=str(var_dir), DJANGO_SETTINGS_MODULE="controlplane.settings", **extra
    )
    return environ


def _settings_of_a_second_process(var_dir: Path, **extra: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", SHOW_SETTINGS],
        cwd=ROOT,
        env=_environ(var_dir, **extra),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def _write_demo_file(var_dir: Path) -> runtime.DemoRuntime:
    # This test process plays the demo: its pid is alive while the second process reads.
    return runtime.write_runtime(
        var_dir, redis_url=DEMO_REDIS, database_url=DEMO_DB, redis_key_prefix="demo-run:"
    )


def test_a_second_process_uses_the_running_demos_redis_and_database(tmp_path):
    _write_demo_file(tmp_path)
    seen = _settings_of_a_second_process(tmp_path)
    assert seen["redis"] == seen["broker"] == seen["cache"] == DEMO_REDIS
    assert seen["prefix"] == "demo-run:"
    assert seen["db"] == ["django.db.backends.postgresql", "demo_db", "127.0.0.1", "5432"]
    assert seen["notice"] == ""


def test_the_environment_wins_and_the_difference_is_named(tmp_path):
    _write_demo_file(tmp_path)
    seen = _settings_of_a_second_process(
        tmp_path, REDIS_URL="redis://127.0.0.1:6379/3", REDIS_KEY_PREFIX=""
    )
    assert seen["redis"] == seen["broker"] == "redis://127.0.0.1:6379/3"
    assert seen["prefix"] == ""  # set but empty is a choice too
    assert seen["db"][1] == "demo_db"  # not given: still the demo's
    notice = seen["notice"]
    assert "Redis redis://127.0.0.1:6379/3 (the demo's: redis://127.0.0.1:45678/0)" in notice
    assert "database" not in notice.split("Redis", 1)[1].split(".")[0]
    assert "s3cret" not in notice


def test_a_stale_file_is_ignored(tmp_path):
    finished = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        text=True,
        capture_output=True,
        check=True,
    )
    gone_pid = int(finished.stdout)
    demo = _write_demo_file(tmp_path)
    path = runtime.runtime_path(tmp_path)
    for stale in (
        replace(demo, pid=gone_pid),  # the demo was killed without cleaning up
        replace(demo, process_start="1"),  # its pid now belongs to another process
    ):
        path.write_text(json.dumps(stale.__dict__))
        assert runtime.read_live_runtime(tmp_path) is None
    seen = _settings_of_a_second_process(tmp_path)
    assert seen["redis"] == "redis://127.0.0.1:6379/0"
    assert seen["db"][0] == "django.db.backends.sqlite3"
    assert seen["db"][1] == str(tmp_path / "controlplane.sqlite3")
    assert seen["notice"] == ""


def test_a_command_says_on_stderr_when_it_uses_another_database(tmp_path):
    _write_demo_file(tmp_path)
    result = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=_environ(tmp_path, DATABASE_URL=f"sqlite:///{tmp_path}/other.sqlite3"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "running demo" not in result.stdout  # stdout stays the command's own
    lines = [line for line in result.stderr.splitlines() if "running demo" in line]
    assert len(lines) == 1
    assert f"database sqlite:///{tmp_path}/other.sqlite3" in lines[0]
    assert "the demo's: postgres://demo:***@127.0.0.1:5432/demo_db" in lines[0]
    assert "s3cret" not in result.stderr


def test_remove_only_removes_this_processes_file(tmp_path):
    demo = _write_demo_file(tmp_path)
    path = runtime.runtime_path(tmp_path)
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    path.write_text(json.dumps(replace(demo, pid=demo.pid + 1).__dict__))
    runtime.remove_runtime(tmp_path)
    assert path.exists()  # another demo's
    _write_demo_file(tmp_path)
    runtime.remove_runtime(tmp_path)
    assert not path.exists()
    runtime.remove_runtime(tmp_path)  # gone already: fine


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:pw@127.0.0.1:6379/0", "redis://:***@127.0.0.1:6379/0"),
        ("postgres://u:pw@db:5432/x", "postgres://u:***@db:5432/x"),
        ("postgres://u@[::1]/x", "postgres://u@[::1]/x"),
        ("postgres://u:pw@[::1]/x", "postgres://u:***@[::1]/x"),
        ("sqlite:////tmp/a.sqlite3", "sqlite:////tmp/a.sqlite3"),
    ],
)
def test_urls_are_printed_without_passwords(url, shown):
    assert runtime.redacted(url) == shown


def test_the_notice_is_empty_for_the_same_runtime_spelled_differently():
    demo = runtime.DemoRuntime(1, "", "redis://127.0.0.1:6379/0", "postgres://u@h:5432/x", "")
    same = {
        "redis_url": "redis://127.0.0.1:6379",
        "database_url": "postgresql://u@h:5432/x",
        "redis_key_prefix": "",
    }
    assert runtime.runtime_notice(demo, **same) == ""
    assert runtime.runtime_notice(None, **same) == ""
    assert "key prefix" in runtime.runtime_notice(demo, **(same | {"redis_key_prefix": "p:"}))
