"""`manage.py quarantine list [SOURCE] [--state S] | show ID | retry ID | release ID --reason R |
drop ID`, the exits acting `--as USER`, each with `--json`.

The exits run through the same action-table rows as the worker page and the API: the named
user's permissions are checked, and the action is audited as that user. Exit codes as every
operator command (docs/operate/refresh-cli.md): 0 done, 2 bad input, 3 not permitted (no such
active user, or no permission), 4 no such quarantine, 5 the quarantine's state does not allow
it. Nothing changes on a refusal.
"""

from __future__ import annotations

from django.core.exceptions import PermissionDenied, ValidationError

from controlplane.accounts.management.commands._cli import (
    EXIT_CODES_HELP,
    Exit,
    OperatorCommand,
    Refused,
    acting_user,
    add_as_argument,
    add_json_argument,
    dumps,
    shown,
)
from controlplane.audit.recorder import Actor
from controlplane.refresh.intents.action_table import QUARANTINE_ACTIONS, ActionInput
from controlplane.refresh.management.commands._refusals import refusal
from controlplane.refresh.models import Quarantine, QuarantineState
from controlplane.refresh.quarantine import (
    QuarantineRefused,
    serialize_journal,
    serialize_quarantine,
)

COLUMNS = ("id", "source", "namespace", "key", "kind", "state", "attempts", "reason")
HELP = {
    "retry": "queue the catch-up again (failed, queued, or its runner went silent)",
    "release": "resume without admitting it (refused unless it reads back the gate's version)",
    "drop": "forget the quarantine of a worker that left the fleet",
}


class Command(OperatorCommand):
    help = "List, show, retry, release or drop quarantined (drifted) workers. " + EXIT_CODES_HELP

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="verb", required=True)
        listing = sub.add_parser("list", help="quarantines, newest first")
        listing.add_argument("source", nargs="?", help="only this source")
        listing.add_argument("--state", choices=QuarantineState.values)
        add_json_argument(listing)
        show = sub.add_parser("show", help="one quarantine with its call journal (JSON)")
        show.add_argument("id", type=int)
        add_json_argument(show)
        for name in QUARANTINE_ACTIONS:
            exit_ = sub.add_parser(name, help=HELP.get(name))
            exit_.add_argument("id", type=int)
            add_as_argument(exit_)
            add_json_argument(exit_)
            if name == "release":
                exit_.add_argument("--reason", required=True, help="why (audited)")

    def handle(self, *args, **opts):
        getattr(self, f"_{opts['verb']}", self._exit)(opts)

    def _list(self, opts) -> None:
        rows = Quarantine.objects.select_related("source").order_by("-id")
        if opts["source"]:
            rows = rows.filter(source__name=opts["source"])
        if opts["state"]:
            rows = rows.filter(state=opts["state"])
        serialized = [serialize_quarantine(q) for q in rows]
        if opts["json"]:
            self.stdout.write(dumps({"ok": True, "quarantines": serialized}))
            return
        for data in serialized:
            self.stdout.write("\t".join(shown(str(data[c])) for c in COLUMNS))

    def _show(self, opts) -> None:
        q = self._quarantine(opts["id"])
        data = {**serialize_quarantine(q), "journal": serialize_journal(q)}
        # Always JSON (the journal is nested data); `--json` adds the `ok` envelope.
        self.stdout.write(dumps({"ok": True, "quarantine": data}) if opts["json"] else dumps(data))

    def _exit(self, opts) -> None:
        action = QUARANTINE_ACTIONS[opts["verb"]]
        user = acting_user(opts["username"], action.perm, f"{action.name} quarantines")
        q = self._quarantine(opts["id"])
        given = ActionInput(reason=opts.get("reason") or "")
        if action.name == "release" and not given.reason.strip():
            raise Refused("a release needs a reason", Exit.USAGE, "invalid_input")
        try:
            result = action.run(q, Actor.for_user(user), given)
        except QuarantineRefused as exc:
            raise Refused("; ".join(exc.messages), Exit.CONFLICT, "conflict") from None
        except (PermissionDenied, ValidationError) as exc:
            raise refusal(exc) from None
        result.refresh_from_db()
        if opts["json"]:
            self.stdout.write(dumps({"ok": True, "quarantine": serialize_quarantine(result)}))
            return
        self.stdout.write(f"{action.message(result)} Now {result.state}: {shown(result.reason)}")

    def _quarantine(self, pk: int) -> Quarantine:
        q = Quarantine.objects.select_related("source").filter(pk=pk).first()
        if q is None:
            raise Refused(f"no quarantine #{pk}", Exit.NOT_FOUND)
        return q
