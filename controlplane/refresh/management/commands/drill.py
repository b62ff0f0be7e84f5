"""`manage.py drill SOURCE [--namespace NS]... [--count N | --instance ID...] --as USER [--json]
[--wait [--timeout S]]` — start a rollback drill (docs/operate/drills.md).

The drill refreshes a small subset of the source's scope to the policy verified before the
current one and back, verifying both. It runs on the Celery workers like a drill from the
source page's button; `--wait` polls the database until it ends. Exit codes are the refresh
command's: 0 started (or, with --wait, rollback proven); 1 the drill failed; 2 bad input;
3 not permitted; 4 no such source; 5 conflict (a refresh or another drill is active, a gate is
not open and verified, or nothing was verified before the current policy); 6 --wait timed out.
"""

from __future__ import annotations

import sys
import time

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
from controlplane.fleet.models import Source
from controlplane.refresh.drills.actions import start_drill
from controlplane.refresh.drills.public import drill_json
from controlplane.refresh.management.commands._refusals import REFUSALS, refusal
from controlplane.refresh.models import DrillOutcome, DrillRun


class Command(OperatorCommand):
    help = (
        "Start a rollback drill: a small subset of SOURCE to the policy verified before the "
        "current one and back, both verified and timed. " + EXIT_CODES_HELP
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("source", help="source name")
        parser.add_argument(
            "--namespace",
            action="append",
            dest="namespaces",
            metavar="NS",
            help="drill only this namespace (repeatable; default: every verified namespace)",
        )
        subset = parser.add_mutually_exclusive_group()
        subset.add_argument(
            "--count",
            type=int,
            help="workers per namespace (default 1; at least one keeps serving)",
        )
        subset.add_argument(
            "--instance",
            action="append",
            dest="instances",
            metavar="ID",
            help="drill this instance id (repeatable) instead of a count",
        )
        add_as_argument(parser)
        add_json_argument(parser)
        parser.add_argument("--wait", action="store_true", help="wait until the drill ends")
        parser.add_argument("--interval", type=float, default=1.0, help="seconds between polls")
        parser.add_argument(
            "--timeout", type=float, default=None, help="with --wait: give up after this (exit 6)"
        )

    def handle(self, *args, **opts):
        if opts["interval"] <= 0:
            raise Refused("--interval must be positive", Exit.USAGE, "invalid_input")
        if opts["timeout"] is not None and opts["timeout"] < 0:
            raise Refused("--timeout must not be negative", Exit.USAGE, "invalid_input")
        user = acting_user(opts["username"], Perm.OPERATE_REFRESH, "run rollback drills")
        source = Source.objects.filter(name=opts["source"]).first()
        if source is None:
            raise Refused(f"no source named {shown(opts['source'])}", Exit.NOT_FOUND)
        try:
            drill = start_drill(
                source,
                actor=Actor.for_user(user),
                namespaces=opts["namespaces"],
                count=opts["count"],
                instances=opts["instances"],
            )
        except REFUSALS as exc:
            # A conflict or a state without anything to roll back to is 5, bad input 2.
            raise refusal(exc) from None
        self._show(drill, "started")
        if not opts["wait"]:
            return
        outcome = self._wait(drill, opts["interval"], opts["timeout"])
        if outcome != Exit.OK:
            sys.exit(int(outcome))

    def _show(self, drill: DrillRun, event: str) -> None:
        drill = DrillRun.objects.select_related("source").get(pk=drill.pk)
        if self.json:
            self.stdout.write(
                dumps({"ok": drill.outcome != DrillOutcome.FAILED, "drill": drill_json(drill)})
            )
            return
        if event == "started":
            self.stdout.write(
                f"rollback drill #{drill.pk} started on {drill.source.name}: "
                f"{len(drill.instances)} worker(s) {shown(drill.current_version)} -> "
                f"{shown(drill.previous_version)} -> back (audited)"
            )
        elif drill.outcome == DrillOutcome.SUCCEEDED:
            self.stdout.write(
                f"rollback drill #{drill.pk} proved rollback: "
                f"forward {drill.forward_seconds:.1f} s "
                f"(policy refresh #{drill.forward_refresh_id}), back {drill.back_seconds:.1f} s "
                f"(policy refresh #{drill.back_refresh_id})"
            )
        elif drill.outcome == DrillOutcome.FAILED:
            self.stdout.write(f"rollback drill #{drill.pk} failed: {shown(drill.reason)}")
            self.stdout.write(f"next: {shown(drill.next_step)}")
        else:
            self.stdout.write(f"rollback drill #{drill.pk} still {drill.phase}")

    def _wait(self, drill: DrillRun, interval: float, timeout: float | None) -> Exit:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            drill.refresh_from_db()
            if not drill.is_running:
                self._show(drill, "ended")
                return Exit.OK if drill.outcome == DrillOutcome.SUCCEEDED else Exit.FAILED
            if deadline is not None and time.monotonic() >= deadline:
                self._show(drill, "waiting")
                return Exit.TIMED_OUT
            time.sleep(interval)

    def execute(self, *args, **options):
        self.json = bool(options.get("json"))
        return super().execute(*args, **options)
