"""`manage.py refresh plan|start|approve|reject|abort|discard|retry|rollback|end|
resolve-membership|reopen-verified|force-reopen|pause|continue|approve-canary|reject-canary|
status|watch|list` — every policy refresh action from a terminal or a script.

Each action runs its row of `refresh.action_table`, the same row the refresh page and the JSON
API run: the `--as` user's role is checked against the row's permission, the action function
writes and audits in one transaction under that user's name and enqueues the executor on
commit. `plan` calls `intents.plan_policy_refresh` like the plan form and the API. Nothing here
writes a refresh model itself.

It lives in intake, next to the API, so `--json` prints the API's own keys for a refresh
(`RefreshOut`); the other keys are listed in docs/operate/refresh-cli.md.
"""

from __future__ import annotations

import sys

from django.core.management.base import CommandParser

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
from controlplane.accounts.roles import Perm
from controlplane.audit.recorder import Actor
from controlplane.intake.api.refreshes import RefreshOut, serialize_refresh
from controlplane.intake.management.commands._plan_options import (
    add_plan_arguments,
    blocker_lines,
    plan_from_options,
)
from controlplane.intake.management.commands._refresh_status import (
    progress_line,
    status_of,
    status_text,
    watch,
)
from controlplane.refresh.errors import ApprovalNotAllowed
from controlplane.refresh.intents.action_table import REFRESH_ACTIONS, ActionInput
from controlplane.refresh.management.commands._refusals import REFUSALS, refusal
from controlplane.refresh.models import ACTIVE_STATES, PolicyRefresh, RefreshState
from controlplane.refresh.strategy import stored as stored_strategy

#: What each action does, for `--help`.
ACTION_HELP = {
    "start": "start a planned refresh (it waits for approval where the source requires one)",
    "approve": "approve a refresh awaiting approval (not your own); it starts",
    "reject": "reject a refresh awaiting approval (not your own), with a reason",
    "abort": "stop now: cancel the calls in flight (aborting), then end aborted with its "
    "gates closed and what it paused left paused, or resume those first with "
    "--resume-engines; returns at once (--watch waits for aborted, exit 0)",
    "discard": "throw away a planned refresh that was never started",
    "retry": "re-run the failed step of a held refresh on failed and unreached workers",
    "rollback": "plan and start a new refresh back to the last verified policy",
    "end": "close out a refresh without calling workers (gates stay closed), with a reason",
    "resolve-membership": "drop leavers, leave joiners out, and run the held step again",
    "reopen-verified": "open every namespace whose workers all passed verify",
    "force-reopen": "open one namespace's gate without verification, with a reason",
    "pause": "let the wave in progress finish, then wait until continued",
    "continue": "run the next wave of a refresh waiting at a pause point",
    "approve-canary": "pass a canary awaiting a person's approval; the rest follows",
    "reject-canary": "fail a canary awaiting a verdict, with a reason: it is rolled back, "
    "then the refresh holds",
}
AWAITING_APPROVAL = RefreshState.AWAITING_APPROVAL
#: The inputs each action reads (`ActionInput` fields); the rest take none.
REASON_REQUIRED = frozenset({"reject", "end", "force-reopen", "reject-canary"})
REASON_OPTIONAL = frozenset({"discard", "approve-canary"})
DEFAULT_INTERVAL = 1.0


def refresh_json(refresh: PolicyRefresh) -> dict:
    return RefreshOut.model_validate(serialize_refresh(refresh)).model_dump(mode="json")


class Command(OperatorCommand):
    help = (
        "Plan, act on, read and watch policy refreshes. Actions act --as a named user whose "
        "role is checked; the audit names them. " + EXIT_CODES_HELP
    )

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")

        plan = sub.add_parser("plan", help="plan a refresh (fresh discovery); nothing is touched")
        add_plan_arguments(plan)
        add_as_argument(plan)
        add_json_argument(plan)

        for name, action in REFRESH_ACTIONS.items():
            verb = sub.add_parser(name, help=ACTION_HELP.get(name, action.success))
            verb.add_argument("id", type=int, help="policy refresh id")
            if name == "force-reopen":
                verb.add_argument("--namespace", required=True, help="the namespace to open")
            if name in REASON_REQUIRED | REASON_OPTIONAL:
                verb.add_argument(
                    "--reason", required=name in REASON_REQUIRED, default="", help="audited"
                )
            if name == "abort":
                verb.add_argument(
                    "--resume-engines",
                    action="store_true",
                    help="resume the engines it paused and end aborted (gates stay closed)",
                )
            add_as_argument(verb)
            add_json_argument(verb)
            self._add_watch_arguments(verb, optional=True)

        status = sub.add_parser("status", help="state, step, progress, per-namespace outcome")
        status.add_argument("id", type=int)
        add_json_argument(status)

        watching = sub.add_parser(
            "watch", help="stream progress until succeeded (exit 0) or stopped (exit 1)"
        )
        watching.add_argument("id", type=int)
        add_json_argument(watching)
        self._add_watch_arguments(watching, optional=False)

        listing = sub.add_parser("list", help="refreshes, newest first")
        listing.add_argument("--source", help="only this source")
        listing.add_argument("--state", action="append", choices=RefreshState.values)
        listing.add_argument("--active", action="store_true", help="only those holding a scope")
        listing.add_argument("--limit", type=int, default=20)
        add_json_argument(listing)

    @staticmethod
    def _add_watch_arguments(parser, *, optional: bool) -> None:
        if optional:
            parser.add_argument("--watch", action="store_true", help="then watch it until it stops")
        parser.add_argument(
            "--interval", type=float, default=DEFAULT_INTERVAL, help="seconds between polls"
        )
        parser.add_argument(
            "--timeout", type=float, default=None, help="give up watching after this (exit 6)"
        )

    def handle(self, *args, **opts):
        verb = opts["verb"]
        # Checked before anything acts, so a bad --interval never leaves an action half-watched.
        if opts.get("interval") is not None and opts["interval"] <= 0:
            raise Refused("--interval must be positive", Exit.USAGE, "invalid_input")
        if opts.get("timeout") is not None and opts["timeout"] < 0:
            raise Refused("--timeout must not be negative", Exit.USAGE, "invalid_input")
        if verb in REFRESH_ACTIONS:
            self._act(opts)
        else:
            getattr(self, f"_{verb}")(opts)

    # -- reading --------------------------------------------------------------------------------

    def _refresh(self, pk: int) -> PolicyRefresh:
        refresh = (
            PolicyRefresh.objects.select_related("source", "approved_by").filter(pk=pk).first()
        )
        if refresh is None:
            raise Refused(f"no policy refresh #{pk}", Exit.NOT_FOUND)
        return refresh

    def _list(self, opts) -> None:
        refreshes = PolicyRefresh.objects.select_related("source", "approved_by").order_by("-id")
        if opts["source"]:
            refreshes = refreshes.filter(source__name=opts["source"])
        if opts["state"]:
            refreshes = refreshes.filter(state__in=opts["state"])
        if opts["active"]:
            refreshes = refreshes.filter(state__in=ACTIVE_STATES)
        rows = [refresh_json(r) for r in refreshes[: max(opts["limit"], 0)]]
        if opts["json"]:
            self.stdout.write(dumps({"ok": True, "refreshes": rows}))
            return
        if not rows:
            self.stdout.write("no policy refreshes")
            return
        table = [("ID", "SOURCE", "NAMESPACES", "VERSION", "STATE", "REQUESTED BY", "CREATED")]
        for r in rows:
            table.append(
                (
                    str(r["id"]),
                    r["source"],
                    shown(",".join(r["namespaces"]))[:40],
                    shown(r["target"].get("weight_version"))[:30],
                    r["state"],
                    shown(r["requested_by"])[:30],
                    r["created_at"][:19],
                )
            )
        widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
        for row in table:
            cells = (c.ljust(w) for c, w in zip(row, widths, strict=True))
            self.stdout.write("  ".join(cells).rstrip())

    def _status(self, opts) -> None:
        self._refresh(opts["id"])
        status = status_of(opts["id"])
        if opts["json"]:
            self.stdout.write(dumps({"ok": True, **status}))
        else:
            self.stdout.write(status_text(status))

    def _watch(self, opts) -> None:
        self._refresh(opts["id"])
        self._watch_until_stopped(opts["id"], opts)

    def _watch_until_stopped(self, pk: int, opts, wanted: str = RefreshState.SUCCEEDED) -> None:
        """Stream progress; exit with the outcome (0 when it ends `wanted` — succeeded, or
        aborted after an abort —, 1 stopped otherwise, 6 timed out). On a terminal the line is
        redrawn in place; otherwise one line per change."""
        tty = not opts["json"] and self.stdout.isatty()
        shown_lines: list[str] = []

        def show(status) -> None:
            if opts["json"]:
                self.stdout.write(dumps({"ok": True, **status}))
                return
            line = progress_line(status)
            if shown_lines and shown_lines[-1] == line:
                return  # only a step's detail changed; the line would repeat itself
            shown_lines.append(line)
            if tty:
                self.stdout.write("\r\x1b[K" + line, ending="")
                self.stdout.flush()
            else:
                self.stdout.write(line)

        status, outcome = watch(
            pk, interval=opts["interval"], timeout=opts["timeout"], on_change=show
        )
        if status["state"] == wanted:
            outcome = Exit.OK
        if tty:
            self.stdout.write("")
        if not opts["json"]:
            r = status["refresh"]
            reason = r["held_reason"] or r["end_reason"]
            verdict = {
                Exit.OK: f"succeeded at {shown(r['target'].get('weight_version'))}"
                if status["state"] == RefreshState.SUCCEEDED
                else f"{status['state']}: {shown(r['end_reason'])}",
                Exit.TIMED_OUT: f"still {status['state']} after {opts['timeout']} s",
            }.get(outcome, status["state"] + (f": {shown(reason)}" if reason else ""))
            self.stdout.write(f"policy refresh #{pk} {verdict}")
        if outcome != Exit.OK:
            sys.exit(int(outcome))

    # -- acting ---------------------------------------------------------------------------------

    def planned(self, opts, doing: str = "plan policy refreshes"):
        """(the `--as` user, a stored plan from the plan options): `plan`, and `policy_refresh`
        before it starts the plan."""
        user = acting_user(opts["username"], Perm.OPERATE_REFRESH, doing)
        return user, plan_from_options(opts, Actor.for_user(user))

    def run_action(self, name: str, refresh: PolicyRefresh, user, given: ActionInput):
        """One row of the action table as `user`, a refusal turned into its exit code."""
        action = REFRESH_ACTIONS[name]
        try:
            result = action.run(refresh, Actor.for_user(user), given)
        except REFUSALS as exc:
            error = refusal(exc)
            refresh.refresh_from_db(fields=["state"])
            # Four eyes: on a refresh that does await approval, this refusal is about who asks.
            if isinstance(exc, ApprovalNotAllowed) and refresh.state == AWAITING_APPROVAL:
                error = Refused(error.args[0], Exit.NOT_PERMITTED, exc.code)
            raise error from None
        return self._refresh(result.pk)

    def _plan(self, opts) -> None:
        user, refresh = self.planned(opts)
        blockers = blocker_lines(refresh)
        if opts["json"]:
            self.stdout.write(
                dumps({"ok": not blockers, "refresh": refresh_json(refresh), "blockers": blockers})
            )
        else:
            self.stdout.write(
                f"planned policy refresh #{refresh.pk}: {refresh.source.name} "
                f"{', '.join(shown(n) for n in refresh.namespaces)} -> "
                f"{shown(refresh.weight_version)}, {refresh.workers.count()} workers"
            )
            self.stdout.write(f"  strategy: {stored_strategy(refresh).describe()}")
            for line in blockers:
                self.stdout.write(f"  BLOCKED: {line}")
            if not blockers:
                self.stdout.write(
                    f"start it: manage.py refresh start {refresh.pk} --as {user.get_username()}"
                )
        if blockers:
            sys.exit(int(Exit.FAILED))

    def _act(self, opts) -> None:
        action = REFRESH_ACTIONS[opts["verb"]]
        user = acting_user(opts["username"], action.perm, f"{action.name} policy refreshes")
        refresh = self._refresh(opts["id"])
        given = ActionInput(
            reason=opts.get("reason") or "",
            resume_engines=bool(opts.get("resume_engines")),
            namespace=opts.get("namespace") or "",
        )
        result = self.run_action(opts["verb"], refresh, user, given)
        if opts["json"]:  # with --watch, watch's documents follow (JSON lines)
            self.stdout.write(
                dumps({"ok": True, "action": action.name, "refresh": refresh_json(result)})
            )
        else:
            self.stdout.write(
                f"{action.message(result)} Policy refresh #{result.pk} is now {result.state} "
                f"(by {user.get_username()}, audited)."
            )
        if opts["watch"]:
            # An abort's watch ends well when the refresh ends aborted (after `aborting`).
            aborting = opts["verb"] == "abort"
            wanted = RefreshState.ABORTED if aborting else RefreshState.SUCCEEDED
            self._watch_until_stopped(result.pk, opts, wanted)
