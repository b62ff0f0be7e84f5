"""`manage.py audit verify [--anchors FILE]`, `audit checkpoint` and `audit export`."""

import sys
from pathlib import Path
from typing import TextIO

from django.core.management.base import BaseCommand, CommandError

from controlplane.audit.anchors import (
    AnchorError,
    checkpoint_chain_head,
    load_anchors,
    verification_rows,
)
from controlplane.audit.chain import ChainReport, verify_chain
from controlplane.audit.export import EXPORTERS
from controlplane.audit.models import AuditChainHead, AuditEvent


class Command(BaseCommand):
    help = "Verify the audit hash chain, write a checkpoint of its head, or export events."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="subcommand", required=True)
        verify = sub.add_parser(
            "verify", help="check every row's HMAC and link; exit 1 on the first problem"
        )
        verify.add_argument(
            "--anchors",
            type=Path,
            help="a checkpoint file (AUDIT_ANCHOR_FILE) to check the chain against; without "
            "it, deleting the newest rows cannot be detected",
        )
        checkpoint = sub.add_parser(
            "checkpoint", help="append a signed checkpoint of the chain head now"
        )
        checkpoint.add_argument("--file", type=Path, help="default: AUDIT_ANCHOR_FILE")
        export = sub.add_parser("export", help="stream rows to standard output")
        export.add_argument("--format", choices=sorted(EXPORTERS), default="jsonl")
        export.add_argument("--action", help="only this action")

    def handle(self, *args, subcommand, **options):
        if subcommand == "verify":
            return self._verify(options.get("anchors"))
        if subcommand == "checkpoint":
            return self._checkpoint(options.get("file"))
        return self._export(options["format"], options.get("action"))

    def _verify(self, anchor_file: Path | None):
        anchors = None
        if anchor_file is not None:
            try:
                anchors = load_anchors(anchor_file)
            except OSError as exc:
                raise CommandError(f"cannot read anchors: {exc}") from None
            except AnchorError as exc:
                raise CommandError(f"anchor file does not verify: {exc}") from None
        report = verify_chain(
            verification_rows(), AuditChainHead.objects.filter(pk=1).first(), anchors=anchors
        )
        if not report.ok:
            raise CommandError(
                f"audit chain broken at row #{report.first_bad_sequence}: {report.problem} "
                f"({report.checked} rows verified before it)"
            )
        self.stdout.write(_summary(report, anchors))

    def _checkpoint(self, path: Path | None):
        outcome = checkpoint_chain_head(path)
        if outcome.reason.startswith("refused"):
            raise CommandError(f"no checkpoint written, {outcome.reason}")
        self.stdout.write(outcome.reason)

    def _export(self, fmt: str, action: str | None):
        events = AuditEvent.objects.order_by("sequence")
        if action:
            events = events.filter(action=action)
        # The raw stream under Django's OutputWrapper: exported chunks already end their lines.
        out: TextIO = getattr(self.stdout, "_out", sys.stdout)
        for chunk in EXPORTERS[fmt](events.iterator(chunk_size=2000)):
            out.write(chunk)


def _summary(report: ChainReport, anchors) -> str:
    lines = [f"audit chain intact: {report.checked} rows verified"]
    if report.legacy_rows:
        lines.append(
            f"  rows #1-#{report.legacy_rows}: legacy, unkeyed SHA-256 (written before keying)"
        )
    if report.keyed_from is not None:
        keys = ", ".join(f"{key} x{count}" for key, count in sorted(report.key_ids.items()))
        lines.append(f"  rows #{report.keyed_from}-#{report.last_sequence}: HMAC ({keys})")
    if anchors is None:
        lines.append("  no anchors checked: pass --anchors FILE to detect deleted newest rows")
    elif anchors.newest is None:
        lines.append("  anchor file holds no checkpoints yet")
    else:
        unanchored = report.last_sequence - anchors.newest.sequence
        lines.append(
            f"  {anchors.count} signed checkpoints verified, {report.anchors_matched} rows "
            f"pinned; newest names #{anchors.newest.sequence} at {anchors.newest.time}, "
            f"{unanchored} newer rows rest on the key alone"
        )
    return "\n".join(lines)
