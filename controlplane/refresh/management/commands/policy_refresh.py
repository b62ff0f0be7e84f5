"""`manage.py policy_refresh SOURCE --version V --model-path P [--namespace NS ...]`.

Plans (fresh discovery), prints the plan, and runs the refresh in this process with the same
executor the Celery task uses, printing each step. Exit codes: 0 succeeded, 2 held (reason
printed), 1 refused before starting (blockers, conflict, approval needed, declined).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from controlplane.audit.recorder import Actor
from controlplane.dynamo.fingerprint import fingerprint_from_text
from controlplane.fleet.models import Source
from controlplane.refresh import actions
from controlplane.refresh.errors import RefreshError
from controlplane.refresh.executor.lease import Lease
from controlplane.refresh.executor.runner import Runner
from controlplane.refresh.models import RefreshState, StepRun
from controlplane.refresh.presenters import verification_summary
from controlplane.refresh.targets import PAUSE_MODE_CHOICES

EXIT_REFUSED = 1
EXIT_HELD = 2
#: A fingerprint file holds at most a few hundred numbers; anything bigger is a mistake.
MAX_FINGERPRINT_FILE_BYTES = 64 * 1024


def read_fingerprint(opts) -> dict | None:
    """The trainer fingerprint from the options or a JSON file; raises ValueError."""
    inline = opts["expect_tokens"] or opts["expect_logprobs"] or opts["logprob_tolerance"]
    if opts["fingerprint_file"]:
        if inline:
            raise ValueError("give the fingerprint either inline or as --fingerprint-file")
        path = Path(opts["fingerprint_file"])
        try:
            if path.stat().st_size > MAX_FINGERPRINT_FILE_BYTES:
                raise ValueError(f"{path} is larger than {MAX_FINGERPRINT_FILE_BYTES} bytes")
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            raise ValueError(f"cannot read fingerprint file {path}: {exc}") from None
        return data  # validated by plan_policy_refresh, like any other entry point
    return fingerprint_from_text(
        opts["expect_tokens"] or "", opts["expect_logprobs"] or "", opts["logprob_tolerance"]
    )


class Command(BaseCommand):
    help = "Plan and run a gated policy refresh on a source."

    def create_parser(self, prog_name, subcommand, **kwargs):
        # `--version` is the weight version here (the interface), not Django's.
        kwargs.setdefault("conflict_handler", "resolve")
        return super().create_parser(prog_name, subcommand, **kwargs)

    def add_arguments(self, parser):
        parser.add_argument("source", help="source name")
        parser.add_argument("--version", dest="weight_version", required=True)
        parser.add_argument("--model-path", required=True)
        parser.add_argument("--namespace", action="append", dest="namespaces", default=None)
        parser.add_argument(
            "--pause-mode",
            choices=PAUSE_MODE_CHOICES,
            default="auto",
            help="auto = each family's own default; a family refuses a mode it lacks",
        )
        parser.add_argument(
            "--pause-mode-for",
            action="append",
            default=[],
            metavar="FAMILY=MODE",
            help="a pause mode for one family only, e.g. sglang=retract (repeatable)",
        )
        parser.add_argument("--flush", choices=["auto", "always"], default="auto")
        parser.add_argument("--no-generation", action="store_true", help="skip generation check")
        parser.add_argument("--prompt-token-ids", default="5,6,7,8")
        parser.add_argument("--expected-model", default="")
        parser.add_argument(
            "--expect-tokens",
            metavar="IDS",
            help="trainer fingerprint: comma-separated completion ids every worker must generate",
        )
        parser.add_argument(
            "--expect-logprobs",
            metavar="LPS",
            help="trainer fingerprint: comma-separated reference logprobs of the chosen tokens",
        )
        parser.add_argument(
            "--logprob-tolerance",
            metavar="TOL",
            help="largest allowed |Δ| per reference logprob (default 0.05)",
        )
        parser.add_argument(
            "--fingerprint-file",
            metavar="PATH",
            help='JSON {"completion_token_ids": [...], "logprobs": [...], '
            '"logprob_tolerance": x, "prompt_token_ids": [...]}',
        )
        parser.add_argument("--yes", action="store_true", help="do not ask for confirmation")

    def handle(self, *args, **opts):
        source = Source.objects.filter(name=opts["source"]).first()
        if source is None:
            raise CommandError(f"no source named {opts['source']!r}")
        actor = Actor.system("manage.py policy_refresh")
        try:
            fingerprint = read_fingerprint(opts)
            refresh = actions.plan_policy_refresh(
                source=source,
                actor=actor,
                target={
                    "weight_version": opts["weight_version"],
                    "method": "disk",
                    "model_path": opts["model_path"],
                },
                namespaces=opts["namespaces"],
                pause_mode=opts["pause_mode"],
                pause_modes=dict(item.partition("=")[::2] for item in opts["pause_mode_for"]),
                flush_policy=opts["flush"],
                verification={
                    "generation": not opts["no_generation"],
                    "prompt_token_ids": [int(t) for t in opts["prompt_token_ids"].split(",")],
                    "expected_model": opts["expected_model"],
                },
                fingerprint=fingerprint,
            )
        except (ValidationError, ValueError) as exc:
            self.stderr.write(f"refused: {exc}")
            sys.exit(EXIT_REFUSED)
        self.print_plan(refresh)
        if refresh.plan_blockers:
            # Name each blocked worker and why, so the one line is enough to act on.
            blocked = [
                f"{w.key}: {', '.join(w.blockers)}" for w in refresh.workers.all() if w.blockers
            ]
            self.stderr.write(
                "refused at plan time: " + "; ".join([*refresh.plan_blockers, *blocked])
            )
            sys.exit(EXIT_REFUSED)
        if not opts["yes"] and input("Start this refresh? [y/N] ").strip().lower() != "y":
            self.stderr.write("declined")
            sys.exit(EXIT_REFUSED)
        try:
            refresh = actions.start_policy_refresh(refresh, actor=actor, enqueue=False)
        except RefreshError as exc:
            self.stderr.write(f"refused: {exc.message}")
            sys.exit(EXIT_REFUSED)
        if refresh.state == RefreshState.AWAITING_APPROVAL:
            self.stderr.write(f"policy refresh #{refresh.pk} awaits approval in the UI")
            sys.exit(EXIT_REFUSED)
        state = self.run(refresh.pk)
        refresh.refresh_from_db()
        if state == RefreshState.SUCCEEDED:
            self.stdout.write(f"policy refresh #{refresh.pk} succeeded at {refresh.weight_version}")
            return
        self.stderr.write(
            f"policy refresh #{refresh.pk} {refresh.state} at {refresh.failed_step}: "
            f"{refresh.held_reason or refresh.end_reason}"
        )
        sys.exit(EXIT_HELD)

    def print_plan(self, refresh) -> None:
        self.stdout.write(
            f"Plan #{refresh.pk}: {refresh.source.name} {', '.join(refresh.namespaces)} → "
            f"{refresh.weight_version} ({refresh.target['model_path']})"
        )
        self.stdout.write(f"  verify: {verification_summary(refresh)}")
        for worker in refresh.workers.all():
            self.stdout.write(f"  {worker.key} [{worker.family or '?'}] {worker.system_url}")
            for step, calls in worker.calls.items():
                text = ", ".join(f"{c['method']} {c['path']} {c['body']}" for c in calls)
                if not calls and step == "flush" and worker.flush_skipped:
                    text = f"skipped: {worker.flush_skipped}"
                self.stdout.write(f"      {step}: {text or '—'}")
            for blocker in worker.blockers:
                self.stdout.write(f"      BLOCKED: {blocker}")

    def run(self, refresh_id: int) -> str:
        lease = Lease.claim(refresh_id, "manage.py policy_refresh")
        if lease is None:
            return "not_claimed"
        runner = Runner(lease)
        printed: set[int] = set()
        original = runner._finish_step_run

        def report(step_run, status, detail):
            original(step_run, status, detail)
            if step_run.pk not in printed:
                printed.add(step_run.pk)
                run = StepRun.objects.get(pk=step_run.pk)
                self.stdout.write(
                    f"  {run.name:<15} {status:<7} {run.duration_ms or 0:8.0f} ms  {detail[:200]}"
                )

        runner._finish_step_run = report  # type: ignore[method-assign]  # print each step as it ends
        return runner.run()
