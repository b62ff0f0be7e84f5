"""`manage.py doctor [--only CHECK ...] [--json] [--strict]` — check a running deployment.

Checks: settings (Django's system checks, with the deployment ones in production), database
(answers, migrations applied), redis, celery (a worker answers a ping), beat (its heartbeat is
fresh), every source's listener (through that source's outbound URL policy, as discovery calls
it) and the clock (against the database's and Redis's, compared with the webhook window).

Exit codes: 0 — nothing failed (warnings allowed, unless --strict); 1 — at least one check
failed (or warned, with --strict); 2 — bad command-line arguments.
"""

from __future__ import annotations

import json
import sys

from django.core.management.base import BaseCommand

from controlplane.fleet.management.commands.source import format_table
from controlplane.ops import doctor


class Command(BaseCommand):
    help = "Check this deployment: settings, database, Redis, Celery, beat, listeners, clock."

    def add_arguments(self, parser):
        parser.add_argument(
            "--only",
            action="append",
            choices=list(doctor.CHECKS),
            metavar="CHECK",
            help=f"run only this check (repeat for several): {', '.join(doctor.CHECKS)}",
        )
        parser.add_argument(
            "--json", dest="as_json", action="store_true", help="print findings as JSON"
        )
        parser.add_argument("--strict", action="store_true", help="warnings fail too (exit 1)")

    def handle(self, *args, only: list[str] | None, as_json: bool, strict: bool, **opts):
        findings = doctor.run(only)
        failing = {doctor.FAIL, doctor.WARN} if strict else {doctor.FAIL}
        failed = [f for f in findings if f.status in failing]
        if as_json:
            self.stdout.write(json.dumps([f.__dict__ for f in findings], indent=2))
        else:
            rows = [("CHECK", "STATUS", "DETAIL")]
            rows += [(f.check, f.status.upper(), f.detail) for f in findings]
            self.stdout.write(format_table(rows))
            verdict = f"{len(failed)} problem(s)" if failed else "all checks passed"
            self.stdout.write(f"{doctor.now_text()}: {verdict}")
        if failed:
            sys.exit(1)
