"""What every operator command shares: exit codes, acting as a named user, terminal-safe text
and JSON output. (A leading underscore keeps Django from listing this module as a command.)

It lives in accounts, the lowest app a command needs (users and their roles), so the fleet,
refresh and intake commands can all use it without crossing the layers in pyproject.toml.
"""

from __future__ import annotations

import json
from enum import IntEnum
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from controlplane.accounts.roles import Perm


class Exit(IntEnum):
    """The exit codes of every operator command (docs/operate/refresh-cli.md)."""

    OK = 0
    #: The refresh ended held, failed, aborted or rejected; the plan has blockers; discovery
    #: failed; the operator declined at the prompt.
    FAILED = 1
    #: Bad arguments or bad input (argparse uses 2 too); nothing changed.
    USAGE = 2
    #: No active user of that name, or the user's role does not allow the action.
    NOT_PERMITTED = 3
    #: No such refresh, source, gate, namespace or quarantine.
    NOT_FOUND = 4
    #: The action does not apply in the current state, or another refresh holds the scope.
    CONFLICT = 5
    #: `watch --timeout` ran out while the refresh was still going.
    TIMED_OUT = 6


#: One paragraph for each command's help text (`--help` prints it as written).
EXIT_CODES_HELP = (
    "Exit codes: 0 ok; 1 failed or held (the refresh ended held/failed/aborted/rejected, the "
    "plan has blockers, or discovery failed); 2 usage error or bad input; 3 not permitted "
    "(unknown user or missing role permission); 4 not found; 5 conflict (the action does not "
    "apply in the current state, or another refresh holds the scope); 6 watch timed out."
)


class Refused(CommandError):
    """A refusal with its exit code and a stable error code for `--json`."""

    def __init__(self, message: str, exit_code: Exit, code: str = "") -> None:
        super().__init__(message, returncode=int(exit_code))
        self.exit_code = exit_code
        self.code = code or exit_code.name.lower()

    def as_json(self) -> dict[str, Any]:
        return {
            "ok": False,
            "error": {"code": self.code, "exit": int(self.exit_code), "message": str(self)},
        }


def shown(value: Any) -> str:
    """One value as terminal-safe text: control and format characters escaped, so text from
    outside (namespaces, reasons quoted from listeners) cannot move the cursor."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in text)


def acting_user(username: str, perm: Perm, doing: str):
    """The active user named by `--as`, who must hold `perm`; else a NOT_PERMITTED refusal.

    Audit rows then carry this user, exactly as if they had clicked the button themselves.
    """
    user = get_user_model().objects.filter(username=username, is_active=True).first()
    if user is None:
        raise Refused(f"no active user named {shown(username)}", Exit.NOT_PERMITTED)
    if not user.has_perm(perm):
        raise Refused(
            f"{user.get_username()} may not {doing} (needs {perm.value})", Exit.NOT_PERMITTED
        )
    return user


def dumps(data: Any) -> str:
    """The JSON every `--json` prints: one line, ASCII only (safe in any terminal), times as
    ISO 8601 strings."""
    return json.dumps(data, ensure_ascii=True, default=str, sort_keys=False)


def add_as_argument(parser) -> None:
    parser.add_argument(
        "--as",
        dest="username",
        required=True,
        metavar="USER",
        help="the user acting: their role is checked and the audit names them",
    )


def add_json_argument(parser) -> None:
    parser.add_argument(
        "--json",
        action="store_true",
        help="print JSON (stable keys, docs/operate/refresh-cli.md); on a refusal "
        "{ok: false, error: {code, exit, message}}",
    )


class OperatorCommand(BaseCommand):
    """A command whose refusals are `Refused`s: with `--json` the refusal is printed as JSON
    on stdout too, so a script reads one JSON document whatever happened."""

    def execute(self, *args, **options):
        try:
            return super().execute(*args, **options)
        except Refused as exc:
            if options.get("json"):
                self.stdout.write(dumps(exc.as_json()))
            raise
