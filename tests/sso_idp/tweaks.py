"""ID-token tweaks per person, so tests can make the provider misbehave the ways real ones do
(a clock ahead, an expired token, a numeric subject, several audiences).

Kept in a JSON file beside the provider's database: the test process writes it through
`idp_user --id-token`, the provider process reads it at every token it issues.
"""

import json
import os
import time
from pathlib import Path

#: Claims given as seconds from now rather than as a value.
RELATIVE = ("exp", "iat", "auth_time")


def _path() -> Path:
    return Path(os.environ["IDP_DB"]).with_name("id_token_tweaks.json")


def _load() -> dict[str, dict]:
    try:
        return json.loads(_path().read_text())
    except FileNotFoundError:
        return {}


def save(username: str, tweaks: dict) -> None:
    everyone = _load()
    if tweaks:
        everyone[username] = tweaks
    else:
        everyone.pop(username, None)
    _path().write_text(json.dumps(everyone))


def apply(username: str, claims: dict) -> dict:
    """`claims` with this person's tweaks on top; a tweak of null removes the claim."""
    now = int(time.time())
    for claim, value in _load().get(username, {}).items():
        if value is None:
            claims.pop(claim, None)
        elif claim in RELATIVE:
            claims[claim] = now + int(value)
        else:
            claims[claim] = value
    return claims
