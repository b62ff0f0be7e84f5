"""Audit keys: parsed strictly, generated once in development, required in production."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from controlplane.audit.keys import Keyring, local_key, parse_keys

ROOT = Path(__file__).resolve().parents[3]
SECRET = "s" * 32


def test_pairs_parse_newest_first():
    keys = parse_keys(f" k2:{SECRET}2 , k1:{SECRET}:with:colons ,", "AUDIT_HMAC_KEY")
    ring = Keyring(keys)
    assert ring.signing.id == "k2"
    assert ring.secret("k1") == f"{SECRET}:with:colons".encode()
    assert SECRET not in repr(keys)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("", "at least one"),
        (SECRET, "id:secret pairs"),
        (f"bad id:{SECRET}", "id:secret pairs"),
        ("k1:short", "at least 32 characters"),
        (f"k1:{SECRET},k1:{SECRET}x", "appears twice"),
    ],
)
def test_bad_keys_name_the_variable(raw, message):
    with pytest.raises(ImproperlyConfigured, match=f"AUDIT_HMAC_KEY.*{message}"):
        parse_keys(raw, "AUDIT_HMAC_KEY")


def test_development_key_is_generated_once_even_when_processes_race(tmp_path):
    with ThreadPoolExecutor(8) as pool:
        keys = set(pool.map(lambda _: local_key(tmp_path), range(16)))
    assert len(keys) == 1
    key_id = parse_keys(keys.pop(), "file")[0].id
    assert key_id.startswith("local-")
    assert oct((tmp_path / "audit_hmac_key").stat().st_mode & 0o777) == "0o600"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["audit_hmac_key"]


def _check(extra: dict[str, str]) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("AUDIT_")}
    environ.update(extra)
    return subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_production_requires_an_audit_key(tmp_path):
    production = {
        "CONTROLPLANE_ENV": "production",
        "SECRET_KEY": "k" * 20 + "production-secret-for-the-settings-check-0123456789",
        "ALLOWED_HOSTS": "cp.example",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        "CONTROLPLANE_VAR_DIR": str(tmp_path),
    }
    result = _check(production)
    assert result.returncode != 0
    assert "AUDIT_HMAC_KEY must be set" in result.stderr
    assert not (tmp_path / "audit_hmac_key").exists()  # no silent fallback to a local key

    result = _check(production | {"AUDIT_HMAC_KEY": "k1:short"})
    assert result.returncode != 0 and "at least 32 characters" in result.stderr

    assert _check(production | {"AUDIT_HMAC_KEY": f"k1:{SECRET}"}).returncode == 0
