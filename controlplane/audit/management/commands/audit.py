"""`manage.py audit verify` and `manage.py audit export --format jsonl|csv`."""

import sys

from django.core.management.base import BaseCommand, CommandError

from controlplane.audit.chain import verify_chain
from controlplane.audit.export import EXPORTERS
from controlplane.audit.models import AuditChainHead, AuditEvent


class Command(BaseCommand):
    help = "Verify the audit hash chain or export audit events."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="subcommand", required=True)
        sub.add_parser(
            "verify", help="check every row's hash and link; exit 1 on the first bad row"
        )
        export = sub.add_parser("export", help="stream rows to standard output")
        export.add_argument("--format", choices=sorted(EXPORTERS), default="jsonl")
        export.add_argument("--action", help="only this action")

    def handle(self, *args, subcommand, **options):
        if subcommand == "verify":
            return self._verify()
        return self._export(options["format"], options.get("action"))

    def _verify(self):
        events = AuditEvent.objects.order_by("sequence").iterator(chunk_size=2000)
        report = verify_chain(events, AuditChainHead.objects.filter(pk=1).first())
        if not report.ok:
            raise CommandError(
                f"audit chain broken at row #{report.first_bad_sequence}: {report.problem} "
                f"({report.checked} rows verified before it)"
            )
        self.stdout.write(f"audit chain intact: {report.checked} rows verified")

    def _export(self, fmt: str, action: str | None):
        events = AuditEvent.objects.order_by("sequence")
        if action:
            events = events.filter(action=action)
        out = self.stdout._out if hasattr(self.stdout, "_out") else sys.stdout
        for chunk in EXPORTERS[fmt](events.iterator(chunk_size=2000)):
            out.write(chunk)
