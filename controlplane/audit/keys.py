"""The keys that sign the audit chain and its checkpoints. They live outside the database.

Someone who can write the database can recompute plain SHA-256 hashes, so a plain hash chain
only catches careless edits. Each row's hash is therefore an HMAC-SHA256 under a key the
database never sees: `AUDIT_HMAC_KEY` in the environment, or in development a key file in the
var dir generated on first use. Keys are `id:secret` pairs, comma separated, newest first:
the first one signs, the others only verify rows signed before a rotation. Every row stores the
id of the key that signed it.

This module is imported by settings, so it must not import models (`django.conf.settings` is
lazy: it is only read when a keyring is asked for, after settings have loaded).
"""

from __future__ import annotations

import os
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

KEY_ID = re.compile(r"^[A-Za-z0-9_.-]{1,32}$")
MIN_SECRET_CHARS = 32
LOCAL_KEY_FILE = "audit_hmac_key"


@dataclass(frozen=True)
class AuditKey:
    id: str
    secret: bytes = field(repr=False)


def parse_keys(raw: str, variable: str) -> tuple[AuditKey, ...]:
    """`id:secret[,id:secret…]` → keys, newest (signing) first. Bad input names the variable."""
    keys: list[AuditKey] = []
    for item in (part.strip() for part in raw.split(",")):
        if not item:
            continue
        key_id, sep, secret = item.partition(":")
        if not sep or not KEY_ID.match(key_id):
            raise ImproperlyConfigured(
                f"{variable} must be comma-separated id:secret pairs with ids of 1-32 letters, "
                "digits, '.', '_' or '-'"
            )
        if len(secret) < MIN_SECRET_CHARS:
            raise ImproperlyConfigured(
                f"{variable}: the secret of key {key_id!r} must be at least "
                f"{MIN_SECRET_CHARS} characters"
            )
        if any(k.id == key_id for k in keys):
            raise ImproperlyConfigured(f"{variable}: key id {key_id!r} appears twice")
        keys.append(AuditKey(key_id, secret.encode()))
    if not keys:
        raise ImproperlyConfigured(f"{variable} must name at least one id:secret key")
    return tuple(keys)


def local_key(var_dir: Path) -> str:
    """The development key, generated once per var dir.

    Web, worker and beat start together, so the file is created with a hard link that fails if
    another process won the race; everyone then reads the same key. The id carries a random
    suffix so rows signed with a lost key say so instead of failing as if they were forged.
    """
    path = var_dir / LOCAL_KEY_FILE
    if not path.exists():
        var_dir.mkdir(parents=True, exist_ok=True)
        candidate = var_dir / f".{LOCAL_KEY_FILE}.{os.getpid()}.{secrets.token_hex(4)}"
        candidate.write_text(f"local-{secrets.token_hex(4)}:{secrets.token_urlsafe(48)}\n")
        candidate.chmod(0o600)
        try:
            os.link(candidate, path)
        except FileExistsError:
            pass
        finally:
            candidate.unlink()
    return path.read_text().strip()


class Keyring:
    """Keys by id; the first one signs."""

    def __init__(self, keys: tuple[AuditKey, ...]):
        if not keys:
            raise ImproperlyConfigured("no audit keys are configured")
        self.signing = keys[0]
        self._secrets = {key.id: key.secret for key in keys}

    def secret(self, key_id: str) -> bytes | None:
        return self._secrets.get(key_id)

    @property
    def ids(self) -> list[str]:
        return list(self._secrets)


def hmac_keyring() -> Keyring:
    return Keyring(tuple(settings.AUDIT_HMAC_KEYS))


def anchor_keyring() -> Keyring:
    """Checkpoints use `AUDIT_ANCHOR_KEY` when set, else the row keys."""
    return Keyring(tuple(settings.AUDIT_ANCHOR_KEYS or settings.AUDIT_HMAC_KEYS))
