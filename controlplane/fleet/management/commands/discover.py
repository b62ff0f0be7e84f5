"""`manage.py discover [SOURCE]` — one synchronous refresh, printed as a table.

Exit 0 when every refresh succeeded; otherwise exit 1 with one line naming the reason
(listener unreachable, invalid payload, ...). The refresh is recorded and audited like a
scheduled one.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from controlplane.fleet.discovery import refresh_source
from controlplane.fleet.management.commands.source import format_table
from controlplane.fleet.models import DiscoveryTrigger, Source, Worker, WorkerState
from controlplane.fleet.presenters import version_label

#: How long to wait for a refresh another process is running on the same source.
CLAIM_WAIT_SECONDS = 60.0


class Command(BaseCommand):
    help = "Run one discovery refresh now and print the workers."

    def add_arguments(self, parser):
        parser.add_argument("source", nargs="?", help="source name (default: every enabled one)")
        parser.add_argument("--all-states", action="store_true", help="also list gone workers")

    def handle(self, *args, source=None, all_states=False, **opts):
        if source:
            sources = list(Source.objects.filter(name=source))
            if not sources:
                raise CommandError(f"no source named {source!r}")
        else:
            sources = list(Source.objects.filter(enabled=True))
            if not sources:
                raise CommandError("no enabled sources; add one with `manage.py source add`")
        failures = []
        for src in sources:
            run = refresh_source(src.pk, trigger=DiscoveryTrigger.MANUAL, wait=CLAIM_WAIT_SECONDS)
            if run is None:
                failures.append(f"{src.name}: another refresh held the source too long")
                continue
            workers = Worker.objects.filter(source=src)
            if not all_states:
                workers = workers.exclude(state=WorkerState.GONE)
            header = (
                f"{src.name}: listener namespace {run.reported_namespace or '?'}, "
                f"{run.workers_total} workers ({run.workers_erroring} erroring), "
                f"+{run.joined} -{run.left} ~{run.changed}, {run.duration_ms or 0:.0f} ms"
            )
            if not run.ok:
                header = f"{src.name}: listener failed: {run.error} (showing last known workers)"
                failures.append(f"{src.name}: {run.error}")
            rows = [("IDENTITY", "NAMESPACE", "STATE", "ROUTES", "VERSION", "ERROR")]
            for w in workers:
                version = version_label(w.weight_version) if w.version_probed_at else "-"
                rows.append(
                    (
                        w.key,
                        w.namespace,
                        w.state + (" (static)" if w.is_static else ""),
                        ",".join(w.routes or ()) or "-",
                        version,
                        w.error or w.version_error or w.liveness_error or "",
                    )
                )
            self.stdout.write(header)
            self.stdout.write(format_table(rows))
        if failures:
            raise CommandError("; ".join(failures))
