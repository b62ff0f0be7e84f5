"""How each kind of process holds PostgreSQL connections, read from the environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from controlplane.celery import _started_by_celery_command

ROOT = Path(__file__).resolve().parents[2]
PG_URL = "postgres://cp@db.invalid:5432/cp"

_PRINT_DATABASE = (
    "import django, json; django.setup(); from django.conf import settings; "
    "d = settings.DATABASES['default']; "
    "print(json.dumps({'max_age': d['CONN_MAX_AGE'], 'options': d['OPTIONS'], "
    "'health': d['CONN_HEALTH_CHECKS']}, default=lambda f: f'{f.__module__}.{f.__qualname__}'))"
)


def _database_settings(**env: str) -> dict | str:
    """The default database's settings as a fresh process with `env` reads them (nothing
    connects), or the error it stopped with."""
    ours = ("DATABASE_", "CONTROLPLANE_PROCESS")
    environ = {k: v for k, v in os.environ.items() if not k.startswith(ours)}
    environ |= {"DJANGO_SETTINGS_MODULE": "controlplane.settings", "DATABASE_URL": PG_URL, **env}
    done = subprocess.run(
        [sys.executable, "-c", _PRINT_DATABASE],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return json.loads(done.stdout) if done.returncode == 0 else done.stderr


def test_web_process_borrows_from_a_bounded_pool_and_keeps_nothing_per_thread():
    db = _database_settings(DATABASE_POOL_MAX_SIZE="7", DATABASE_POOL_TIMEOUT_SECONDS="3")
    assert db["max_age"] == 0
    assert db["options"]["pool"] == {
        "min_size": 2,
        "max_size": 7,
        "timeout": 3.0,
        # A connection is checked before use (a restart or failover leaves dead ones idle).
        "check": "controlplane.dbpool.check_connection",
    }
    assert db["options"]["application_name"] == "controlplane-web"


def test_celery_process_keeps_checked_persistent_connections_and_no_pool():
    db = _database_settings(CONTROLPLANE_PROCESS="celery", DATABASE_CONN_MAX_AGE="120")
    assert db["max_age"] == 120 and db["health"] is True
    assert "pool" not in db["options"]
    assert db["options"]["application_name"] == "controlplane-celery"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"DATABASE_POOL_MIN_SIZE": "5", "DATABASE_POOL_MAX_SIZE": "4"}, "must not exceed"),
        ({"DATABASE_POOL_MAX_SIZE": "0"}, "DATABASE_POOL_MAX_SIZE must be at least 1"),
        ({"CONTROLPLANE_PROCESS": "worker"}, "CONTROLPLANE_PROCESS must be one of web, celery"),
    ],
)
def test_bad_pool_settings_stop_start_up(env, message):
    error = _database_settings(**env)
    assert isinstance(error, str) and message in error


@pytest.mark.parametrize(
    ("argv", "celery"),
    [
        (["/venv/bin/celery", "-A", "controlplane", "worker"], True),
        (["/venv/lib/python3.12/site-packages/celery/__main__.py", "beat"], True),
        (["/venv/bin/daphne", "controlplane.asgi:application"], False),
        (["manage.py", "demo"], False),
        ([], False),
    ],
)
def test_the_celery_command_is_recognised(argv, celery):
    assert _started_by_celery_command(argv) is celery
