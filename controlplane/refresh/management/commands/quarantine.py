"""`manage.py quarantine list [SOURCE] [--state S] | show ID | retry ID | release ID --reason R |
drop ID`, the exits acting `--as USER`.

The exits run through the same action-table rows as the worker page and the API: the named
user's permissions are checked, and the action is audited as that user. Exit codes: 0 done,
1 refused (no such user or quarantine, no permission, or the quarantine's state does not allow
it — nothing changed).
"""

from __future__ import annotations

import json
import sys

from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.management.base import BaseCommand

from controlplane.audit.recorder import Actor
from controlplane.refresh.action_table import QUARANTINE_ACTIONS, ActionInput
from controlplane.refresh.models import Quarantine, QuarantineState
from controlplane.refresh.quarantine import serialize_journal, serialize_quarantine

EXIT_REFUSED = 1
COLUMNS = ("id", "source", "namespace", "key", "kind", "state", "attempts", "reason")
HELP = {
    "retry": "queue the catch-up again (failed, queued, or its runner went silent)",
    "release": "resume without admitting it (refused unless it reads back the gate's version)",
    "drop": "forget the quarantine of a worker that left the fleet",
}


class Refused(Exception):
    pass


class Command(BaseCommand):
    help = "List, show, retry, release or drop quarantined (drifted) workers."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="verb", required=True)
        listing = sub.add_parser("list", help="quarantines, newest first")
        listing.add_argument("source", nargs="?", help="only this source")
        listing.add_argument("--state", choices=QuarantineState.values)
        listing.add_argument("--json", action="store_true", help="one JSON object per line")
        show = sub.add_parser("show", help="one quarantine with its call journal")
        show.add_argument("id", type=int)
        for name in QUARANTINE_ACTIONS:
            exit_ = sub.add_parser(name, help=HELP.get(name))
            exit_.add_argument("id", type=int)
            exit_.add_argument(
                "--as", dest="user", required=True, help="the user acting (checked, audited)"
            )
            if name == "release":
                exit_.add_argument("--reason", required=True, help="why (audited)")

    def handle(self, *args, **opts):
        try:
            getattr(self, f"_{opts['verb']}", self._exit)(opts)
        except Refused as exc:
            self.stderr.write(f"refused: {exc}")
            sys.exit(EXIT_REFUSED)

    def _list(self, opts) -> None:
        rows = Quarantine.objects.select_related("source").order_by("-id")
        if opts["source"]:
            rows = rows.filter(source__name=opts["source"])
        if opts["state"]:
            rows = rows.filter(state=opts["state"])
        for q in rows:
            data = serialize_quarantine(q)
            if opts["json"]:
                self.stdout.write(json.dumps(data, default=str))
            else:
                self.stdout.write("\t".join(str(data[c]) for c in COLUMNS))

    def _show(self, opts) -> None:
        q = self._quarantine(opts["id"])
        data = {**serialize_quarantine(q), "journal": serialize_journal(q)}
        self.stdout.write(json.dumps(data, default=str, indent=2))

    def _exit(self, opts) -> None:
        action = QUARANTINE_ACTIONS[opts["verb"]]
        user = get_user_model().objects.filter(username=opts["user"], is_active=True).first()
        if user is None:
            raise Refused(f"no active user {opts['user']!r}")
        if not user.has_perm(action.perm):
            raise Refused(f"{user.get_username()} may not {action.name} quarantines")
        q = self._quarantine(opts["id"])
        given = ActionInput(reason=opts.get("reason") or "")
        try:
            result = action.run(q, Actor.for_user(user), given)
        except (PermissionDenied, ValidationError) as exc:
            messages = getattr(exc, "messages", None) or [str(exc)]
            raise Refused("; ".join(messages)) from None
        result.refresh_from_db()
        self.stdout.write(f"{action.message(result)} Now {result.state}: {result.reason}")

    def _quarantine(self, pk: int) -> Quarantine:
        q = Quarantine.objects.select_related("source").filter(pk=pk).first()
        if q is None:
            raise Refused(f"no quarantine #{pk}")
        return q
