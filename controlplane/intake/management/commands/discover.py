"""`manage.py discover [SOURCE] [--all-states] [--json]` — one synchronous discovery run,
printed as a table (or as JSON for scripts).

Exit 0 when every refresh succeeded; otherwise exit 1, the reason printed once, on one line
(listener unreachable, invalid payload, ...): the table header only says the listener failed,
and the discovery runner's own warning is kept out of the terminal for the command's duration
(the failure is still recorded and audited like a scheduled refresh's).

The ROUTES column is summarised — how many admin routes, then their names, cut to fit the
terminal — because a vLLM worker advertises a dozen and the full list made 260-character
lines. `--json` has them all. It lives in intake, next to the API, so `--json` prints the API's
own keys for workers and discovery runs (`WorkerOut`, `DiscoveryRunOut`).
"""

from __future__ import annotations

import logging
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from controlplane.accounts.management.commands._cli import (
    EXIT_CODES_HELP,
    Exit,
    OperatorCommand,
    Refused,
    add_json_argument,
    dumps,
    shown,
)
from controlplane.fleet.discovery import run_discovery
from controlplane.fleet.management.commands.source import format_table
from controlplane.fleet.models import DiscoveryTrigger, Source, Worker, WorkerState
from controlplane.fleet.presenters import version_label
from controlplane.intake.api.workers import (
    DiscoveryRunOut,
    WorkerOut,
    serialize_run,
    serialize_worker,
)

#: How long to wait for a refresh another process is running on the same source.
CLAIM_WAIT_SECONDS = 60.0
#: The runner's logger, whose warning would repeat the failure this command reports itself.
RUNNER_LOGGER = "controlplane.fleet.discovery.runner"
COLUMNS = ("IDENTITY", "NAMESPACE", "STATE", "ROUTES", "VERSION", "ERROR")
#: The ROUTES column never gets narrower than this, however wide the others are.
MIN_ROUTES_WIDTH = 16


@contextmanager
def runner_warnings_quiet() -> Iterator[None]:
    logger = logging.getLogger(RUNNER_LOGGER)
    previous = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(previous)


def routes_summary(routes: list[str], width: int) -> str:
    """`12: flush_cache,get_weight_version,…` — the count, then names until `width` is full."""
    if not routes:
        return "-"
    text = f"{len(routes)}: " + ",".join(shown(r) for r in routes)
    if len(text) <= width:
        return text
    return text[: max(width - 1, len(str(len(routes))) + 2)].rstrip(",") + "…"


def worker_row(w: Worker) -> tuple[str, ...]:
    version = version_label(w.weight_version) if w.version_probed_at else "-"
    return (
        shown(w.key),
        shown(w.namespace),
        w.state + (" (static)" if w.is_static else ""),
        "",  # routes, filled in once the other columns' widths are known
        shown(version),
        shown(w.error or w.version_error or w.liveness_error or ""),
    )


def fit_routes(rows: list[tuple[str, ...]], routes: list[list[str]], columns: int) -> list[tuple]:
    """Fill each row's ROUTES cell with a summary sized to what the terminal has left."""
    others = sum(max(len(r[i]) for r in rows) + 2 for i in range(len(rows[0])) if i != 3)
    width = max(MIN_ROUTES_WIDTH, columns - others)
    header, *body = rows
    return [header] + [
        (*row[:3], routes_summary(names, width), *row[4:])
        for row, names in zip(body, routes, strict=True)
    ]


class Command(OperatorCommand):
    help = "Run one discovery now and print the workers. " + EXIT_CODES_HELP

    def add_arguments(self, parser):
        parser.add_argument("source", nargs="?", help="source name (default: every enabled one)")
        parser.add_argument("--all-states", action="store_true", help="also list gone workers")
        add_json_argument(parser)

    def handle(self, *args, source=None, all_states=False, **opts):
        if source:
            sources = list(Source.objects.filter(name=source))
            if not sources:
                raise Refused(f"no source named {shown(source)}", Exit.NOT_FOUND)
        else:
            sources = list(Source.objects.filter(enabled=True))
            if not sources:
                raise Refused(
                    "no enabled sources; add one with `manage.py source add`", Exit.NOT_FOUND
                )
        failures: list[str] = []
        results = []
        for src in sources:
            with runner_warnings_quiet():
                run = run_discovery(
                    src.pk, trigger=DiscoveryTrigger.MANUAL, wait=CLAIM_WAIT_SECONDS
                )
            if run is None:
                failures.append(f"{src.name}: another discovery held the source too long")
            elif not run.ok:
                failures.append(f"{src.name}: {run.error}")
            workers = Worker.objects.filter(source=src).select_related("source")
            if not all_states:
                workers = workers.exclude(state=WorkerState.GONE)
            if opts["json"]:
                results.append(self._source_json(src, run, list(workers)))
            else:
                self._print_source(src, run, list(workers))
        message = "; ".join(shown(f) for f in failures)
        if opts["json"]:
            # One JSON document whatever happened: the failures are in it (`ok`, each `run`).
            self.stdout.write(dumps({"ok": not failures, "sources": results}))
            if failures:
                self.stderr.write(message)
                sys.exit(int(Exit.FAILED))
        elif failures:
            raise Refused(message, Exit.FAILED, "discovery_failed")

    def _source_json(self, src: Source, run, workers: list[Worker]) -> dict:
        return {
            "source": src.name,
            "ok": bool(run and run.ok),
            "run": DiscoveryRunOut.model_validate(serialize_run(run)).model_dump(mode="json")
            if run
            else None,
            "workers": [
                WorkerOut.model_validate(serialize_worker(w)).model_dump(mode="json")
                for w in workers
            ],
        }

    def _print_source(self, src: Source, run, workers: list[Worker]) -> None:
        if run is None:
            header = f"{src.name}: not discovered (showing last known workers)"
        elif not run.ok:
            header = f"{src.name}: listener failed (showing last known workers)"
        else:
            header = (
                f"{src.name}: listener namespace {shown(run.reported_namespace or '?')}, "
                f"{run.workers_total} workers ({run.workers_erroring} erroring), "
                f"+{run.joined} -{run.left} ~{run.changed}, {run.duration_ms or 0:.0f} ms"
            )
        self.stdout.write(header)
        if not workers:
            self.stdout.write("  no workers known")
            return
        rows: list[tuple[str, ...]] = [COLUMNS]
        rows += [worker_row(w) for w in workers]
        routes = [[str(r) for r in (w.routes or ())] for w in workers]
        columns = shutil.get_terminal_size((120, 24)).columns
        self.stdout.write(format_table(fit_routes(rows, routes, columns)))
