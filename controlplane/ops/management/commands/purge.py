"""`manage.py purge [--apply]` — delete rows older than their retention (controlplane/ops/
retention.py says which). A dry run by default: it prints what would go and changes nothing;
`--apply` deletes, one audited batch at a time. Beat runs the same purge every
RETENTION_PURGE_SECONDS, so this command is for looking first, or catching up after a change.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

# The command-line actor (`cli:<os user>`) and table layout every command of ours uses.
from controlplane.fleet.management.commands.source import _actor as cli_actor
from controlplane.fleet.management.commands.source import format_table
from controlplane.ops import retention


class Command(BaseCommand):
    help = "Delete rows past their retention; a dry run unless --apply."

    def add_arguments(self, parser):
        parser.add_argument(
            "--apply", action="store_true", help="delete (default: only count what would go)"
        )
        parser.add_argument(
            "--batch-size",
            type=int,
            default=retention.BATCH_SIZE,
            metavar="N",
            help=f"rows per transaction and audit row (default {retention.BATCH_SIZE})",
        )

    def handle(self, *args, apply: bool, batch_size: int, **opts):
        if batch_size < 1:
            raise CommandError("--batch-size must be at least 1")
        actor = cli_actor()
        if apply:
            reports = retention.purge(actor=actor, batch_size=batch_size)
            verb = "DELETED"
        else:
            reports = retention.pending()
            verb = "WOULD DELETE"
        rows = [("KIND", "KEEP", "OLDER THAN", verb)]
        for r in reports:
            keep = f"{r.days} days" if r.days else "forever"
            cutoff = r.cutoff.strftime("%Y-%m-%d %H:%M UTC") if r.cutoff else "-"
            rows.append((r.name, keep, cutoff, str(r.rows)))
        self.stdout.write(format_table(rows))
        if not apply:
            self.stdout.write("dry run: nothing was deleted; run with --apply to delete")
