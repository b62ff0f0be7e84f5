"""`manage.py policy_refresh SOURCE --weight-version V --model-path P --as USER [--yes]` — plan,
confirm, start and see a policy refresh through in one command.

It is an alias of `refresh plan`, then `refresh start --watch`, built on that command (its
subclass): the same plan options, `--as` user and plan (`refresh.Command.planned`), the same
START row of the action table with the same refusals (`run_action`), the same watch loop.
What it adds is the confirmation prompt, the plan printed in full, one line per finished step,
and an executor of its own. START enqueues the executor on commit like
every other entry point; this process also offers to run it — both claim the refresh's fenced
lease, so exactly one executes it (here when no Celery worker is up, e.g. a bare shell) — and
prints each step as it ends until the refresh stops.

The weight version is `--weight-version`: `--version` stays Django's own flag. A `--version`
given together with other arguments (an old script) is refused with a pointer to the new name,
rather than printing Django's version and exiting 0 as if the refresh had run.
"""

from __future__ import annotations

import sys
import threading

from django.core.management.base import CommandParser
from django.db import close_old_connections, connection

from controlplane.accounts.management.commands._cli import (
    EXIT_CODES_HELP,
    Exit,
    Refused,
    add_as_argument,
    add_json_argument,
    dumps,
    shown,
)
from controlplane.intake.management.commands import refresh as refresh_command
from controlplane.intake.management.commands._plan_options import (
    add_plan_arguments,
    blocker_lines,
)
from controlplane.intake.management.commands._plan_print import plan_lines
from controlplane.intake.management.commands._refresh_status import status_of, watch
from controlplane.refresh.executor import execute_refresh
from controlplane.refresh.intents.action_table import ActionInput
from controlplane.refresh.models import RefreshState
from controlplane.refresh.presenters import verification_summary
from controlplane.textlimits import SUMMARY_CHARS

POLL_SECONDS = 0.5
OWNER = "manage.py policy_refresh"


def run_executor(refresh_id: int) -> None:
    """The executor, in a thread of its own (its own database connection, closed after)."""
    try:
        execute_refresh(refresh_id, owner=OWNER)
    finally:
        connection.close()


class Command(refresh_command.Command):
    help = (
        "Plan, start and see through a gated policy refresh on a source, as a named user. "
        + EXIT_CODES_HELP
    )

    def run_from_argv(self, argv):
        if "--version" in argv[2:] and len(argv) > 3:
            self.stderr.write(
                "--version is Django's version flag; give the weight version as --weight-version"
            )
            sys.exit(int(Exit.USAGE))
        super().run_from_argv(argv)

    def add_arguments(self, parser: CommandParser) -> None:
        add_plan_arguments(parser)
        add_as_argument(parser)
        add_json_argument(parser)
        parser.add_argument("--yes", action="store_true", help="do not ask for confirmation")
        parser.add_argument(
            "--workers",
            action="store_true",
            help="print every worker of the plan too (by default workers sharing a plan are "
            "grouped)",
        )

    def handle(self, *args, **opts):
        user, refresh = self.planned(opts, "plan and start policy refreshes")
        if not opts["json"]:
            self.print_plan(refresh, every=opts["workers"])
        blockers = blocker_lines(refresh)
        if blockers:
            raise Refused("refused at plan time: " + "; ".join(blockers), Exit.FAILED, "blocked")
        if not opts["yes"] and not self.confirmed():
            raise Refused("declined", Exit.FAILED, "declined")
        refresh = self.run_action("start", refresh, user, ActionInput())
        if refresh.state == RefreshState.AWAITING_APPROVAL:
            raise Refused(
                f"policy refresh #{refresh.pk} awaits approval: `manage.py refresh approve "
                f"{refresh.pk} --as APPROVER`, then `manage.py refresh watch {refresh.pk}`",
                Exit.FAILED,
                "awaiting_approval",
            )
        self.see_through(refresh.pk, opts)

    def confirmed(self) -> bool:
        # The question goes to stderr, so stdout stays the plan (or one JSON document).
        self.stderr.write("Start this refresh? [y/N] ", ending="")
        self.stderr.flush()
        return sys.stdin.readline().strip().lower() == "y"

    def see_through(self, refresh_id: int, opts) -> None:
        executor = threading.Thread(
            target=run_executor, args=(refresh_id,), name=f"refresh-{refresh_id}", daemon=True
        )
        executor.start()
        printed: set[tuple[str, int]] = set()

        def report(status) -> None:
            for step in status["steps"]:
                key = (step["name"], step["attempts"])
                if step["status"] in ("pending", "running") or key in printed:
                    continue
                printed.add(key)
                if not opts["json"]:
                    ms = step["duration_ms"] or 0
                    self.stdout.write(
                        f"  {step['name']:<15} {step['status']:<7} {ms:8.0f} ms  "
                        f"{shown(step['detail'])[:SUMMARY_CHARS]}"
                    )

        status, outcome = watch(refresh_id, interval=POLL_SECONDS, timeout=None, on_change=report)
        executor.join(timeout=30)
        close_old_connections()
        r = status["refresh"]
        if opts["json"]:
            self.stdout.write(dumps({"ok": outcome == Exit.OK, **status_of(refresh_id)}))
        if outcome == Exit.OK:
            if not opts["json"]:
                self.stdout.write(
                    f"policy refresh #{refresh_id} succeeded at "
                    f"{shown(r['target'].get('weight_version'))}"
                )
            return
        where = f" at {r['failed_step']}" if r["failed_step"] else ""
        self.stderr.write(
            f"policy refresh #{refresh_id} {r['state']}{where}: "
            f"{shown(r['held_reason'] or r['end_reason'])}"
        )
        sys.exit(int(outcome))

    def print_plan(self, refresh, *, every: bool = False) -> None:
        self.stdout.write(
            f"Plan #{refresh.pk}: {refresh.source.name} "
            f"{', '.join(shown(n) for n in refresh.namespaces)} -> "
            f"{shown(refresh.weight_version)} "
            f"({shown(refresh.target.get('model_path') or refresh.target['method'])})"
        )
        self.stdout.write(f"  verify: {verification_summary(refresh)}")
        # Grouped: workers sharing a plan print once (2,000 workers stay readable).
        for line in plan_lines(refresh.workers.all(), shown, every=every):
            self.stdout.write(line)
