"""Settings fail fast with a message naming the bad variable."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from controlplane import env

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("helper", "raw", "message"),
    [
        (lambda: env.env_bool("X_FLAG"), "maybe", "X_FLAG must be a boolean"),
        (lambda: env.env_int("X_FLAG", 1), "ten", "X_FLAG must be an integer"),
        (lambda: env.env_int("X_FLAG", 1, minimum=2), "1", "X_FLAG must be at least 2"),
        (lambda: env.env_float("X_FLAG", 1.0), "fast", "X_FLAG must be a number"),
        (lambda: env.env_choice("X_FLAG", "a", ("a", "b")), "c", "X_FLAG must be one of a, b"),
    ],
)
def test_bad_values_raise_improperly_configured(monkeypatch, helper, raw, message):
    monkeypatch.setenv("X_FLAG", raw)
    with pytest.raises(ImproperlyConfigured, match=message):
        helper()


def test_list_helper_drops_blanks(monkeypatch):
    monkeypatch.setenv("X_LIST", " a, ,b,")
    assert env.env_list("X_LIST") == ["a", "b"]


def _run_check(extra_env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    skip = {"SECRET_KEY", "DATABASE_URL", "DJANGO_ALLOW_ASYNC_UNSAFE"}
    environ = {k: v for k, v in os.environ.items() if k not in skip}
    environ.update(extra_env)
    return subprocess.run(
        [sys.executable, "manage.py", "check", *args],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_production_requires_a_secret_key():
    result = _run_check({"CONTROLPLANE_ENV": "production", "ALLOWED_HOSTS": "cp.example"})
    assert result.returncode != 0
    assert "SECRET_KEY must be set" in result.stderr


def test_bad_database_url_is_reported():
    result = _run_check({"DATABASE_URL": "nosuchdb://x"})
    assert result.returncode != 0
    assert "DATABASE_URL" in result.stderr


def test_production_settings_pass_deploy_check_without_warnings(tmp_path):
    result = _run_check(
        {
            "CONTROLPLANE_ENV": "production",
            "SECRET_KEY": "k" * 20 + "production-secret-for-the-deploy-check-only-0123456789",
            "ALLOWED_HOSTS": "cp.example",
            "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
            "AUDIT_HMAC_KEY": "k1:" + "audit-key-for-the-deploy-check-only-0123456789",
        },
        "--deploy",
        "--fail-level",
        "WARNING",
    )
    assert result.returncode == 0, result.stderr + result.stdout
    assert "no issues" in result.stdout
