"""`manage.py gate list [SOURCE]`, `gate show SOURCE NAMESPACE`, `gate reopen SOURCE NAMESPACE
--reason TEXT --as USER`.

`list` and `show` print what the gate API serves (`refresh.gates.serialize_gate`). `reopen`
force-reopens through the action table's FORCE_REOPEN row, as the named user: the same
permission check, audit and notification as the Gates page and the API. Exit codes: 0 done,
1 refused or bad input (unknown source, namespace or user; no permission; no reason; the gate
is already open or its refresh is running).

Text from outside (namespaces, reasons quoted from listeners) is printed with control and
format characters escaped, so it cannot move the cursor or reorder a terminal line.
"""

from __future__ import annotations

import json

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from controlplane.audit.recorder import Actor
from controlplane.fleet.models import Source
from controlplane.refresh.action_table import FORCE_REOPEN, ActionInput
from controlplane.refresh.errors import RefreshError
from controlplane.refresh.gates import serialize_gate
from controlplane.refresh.models import Gate

EXIT_REFUSED = 1


def shown(value) -> str:
    """One value as terminal-safe text."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in text)


def refused(message: str) -> CommandError:
    return CommandError(message, returncode=EXIT_REFUSED)


class Command(BaseCommand):
    help = "Read gates, and force-reopen one as a named user."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        listing = sub.add_parser("list", help="every gate (of one source)")
        listing.add_argument("source", nargs="?", default=None)
        show = sub.add_parser("show", help="one gate: verified set, drift, since, reason")
        show.add_argument("source")
        show.add_argument("namespace")
        show.add_argument("--json", action="store_true", help="print the gate API's JSON")
        reopen = sub.add_parser("reopen", help="force-reopen without verification (audited)")
        reopen.add_argument("source")
        reopen.add_argument("namespace")
        reopen.add_argument("--reason", required=True, help="why (required, recorded)")
        reopen.add_argument(
            "--as", dest="username", required=True, help="the user who decides; needs the role"
        )

    def handle(self, *args, **opts):
        getattr(self, f"_{opts['action']}")(opts)

    def _source(self, name: str) -> Source:
        source = Source.objects.filter(name=name).first()
        if source is None:
            raise refused(f"no source named {shown(name)!s}")
        return source

    def _gate(self, opts) -> Gate:
        source = self._source(opts["source"])
        gate = (
            Gate.objects.select_related("source")
            .filter(source=source, namespace=opts["namespace"])
            .first()
        )
        if gate is None:
            raise refused(f"source {source.name} has no gate for {shown(opts['namespace'])}")
        return gate

    def _list(self, opts) -> None:
        gates = Gate.objects.select_related("source").order_by("source__name", "namespace")
        if opts["source"]:
            gates = gates.filter(source=self._source(opts["source"]))
        header = (
            "SOURCE",
            "NAMESPACE",
            "STATE",
            "VERSION",
            "VERIFIED",
            "UNVERIFIED",
            "DRIFT",
            "SINCE",
        )
        rows = [header]
        for gate in gates:
            g = serialize_gate(gate)
            rows.append(
                (
                    g["source"],
                    shown(g["namespace"]),
                    g["state"],
                    shown(g["verified_version"]) if g["verified_version"] is not None else "-",
                    str(g["verified_count"]),
                    str(g["unverified_count"]),
                    str(g["drift_count"]),
                    g["since"] or "-",
                )
            )
        if len(rows) == 1:
            self.stdout.write("no gates")
            return
        widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
        for row in rows:
            cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=True)]
            self.stdout.write("  ".join(cells).rstrip())

    def _show(self, opts) -> None:
        g = serialize_gate(self._gate(opts))
        if opts["json"]:
            self.stdout.write(json.dumps(g, indent=2, ensure_ascii=True))
            return
        version = g["verified_version"]
        lines = [
            f"gate {g['source']}/{shown(g['namespace'])}: {g['state']}"
            f" ({'admits rollouts' if g['open'] else 'does not admit rollouts'})",
            f"since: {g['since']}",
            f"reason: {shown(g['reason']) or '-'}",
        ]
        if g["forced"]:
            forced = g["forced"]
            lines.append(f"forced by {shown(forced['by'])} at {forced['at']}")
        lines += [
            f"verified version: {shown(version) if version is not None else '-'}",
            f"verified instances ({g['verified_count']}): "
            + (", ".join(g["verified_instances"]) or "-"),
            f"unverified workers: {g['unverified_count']}",
            f"confirmed at: {g['confirmed_at'] or '-'}",
            f"drift ({g['drift_count']}):",
        ]
        lines += [
            f"  {shown(d.get('key', ''))} instance {shown(d.get('instance_id', ''))}: "
            f"{shown(d.get('kind', ''))} {shown(d.get('detail', ''))}".rstrip()
            for d in g["drift"]
        ] or ["  none"]
        if g["active_refresh_id"]:
            lines.append(f"active refresh: #{g['active_refresh_id']}")
        lines.append(f"revision: {g['revision']}, updated at {g['updated_at']}")
        self.stdout.write("\n".join(lines))

    def _reopen(self, opts) -> None:
        user = get_user_model().objects.filter(username=opts["username"]).first()
        if user is None or not user.is_active:
            raise refused(f"no active user named {shown(opts['username'])}")
        if not user.has_perm(FORCE_REOPEN.perm):
            raise refused(f"{user.get_username()} may not force-reopen gates")
        gate = self._gate(opts)
        try:
            gate = FORCE_REOPEN.run(gate, Actor.for_user(user), ActionInput(reason=opts["reason"]))
        except (RefreshError, ValidationError) as exc:
            message = exc.message if isinstance(exc, RefreshError) else "; ".join(exc.messages)
            raise refused(message) from None
        self.stdout.write(
            f"gate {gate.source.name}/{shown(gate.namespace)} force-reopened: {gate.state} "
            f"(by {user.get_username()}, audited)"
        )
