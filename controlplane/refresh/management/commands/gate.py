"""`manage.py gate list [SOURCE]`, `gate show SOURCE NAMESPACE`, `gate reopen SOURCE NAMESPACE
--reason TEXT --as USER`, each with `--json`.

`list` and `show` print what the gate API serves (`refresh.gates.serialize_gate`; `--json`
prints exactly its keys). `reopen` force-reopens through the action table's FORCE_REOPEN row,
as the named user: the same permission check, audit and notification as the Gates page and the
API. Exit codes as every operator command (docs/operate/refresh-cli.md): 0 done, 2 bad input (no
reason), 3 not permitted (unknown user, no permission), 4 not found (source or gate), 5 the gate
is already open or its refresh is running.

Text from outside (namespaces, reasons quoted from listeners) is printed with control and
format characters escaped, so it cannot move the cursor or reorder a terminal line.
"""

from __future__ import annotations

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
from controlplane.audit.recorder import Actor
from controlplane.fleet.models import Source
from controlplane.refresh.gates import serialize_gate
from controlplane.refresh.intents.action_table import FORCE_REOPEN, ActionInput
from controlplane.refresh.management.commands._refusals import REFUSALS, refusal
from controlplane.refresh.models import Gate


class Command(OperatorCommand):
    help = "Read gates, and force-reopen one as a named user. " + EXIT_CODES_HELP

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        listing = sub.add_parser("list", help="every gate (of one source)")
        listing.add_argument("source", nargs="?", default=None)
        add_json_argument(listing)
        show = sub.add_parser("show", help="one gate: verified set, drift, since, reason")
        show.add_argument("source")
        show.add_argument("namespace")
        add_json_argument(show)
        reopen = sub.add_parser("reopen", help="force-reopen without verification (audited)")
        reopen.add_argument("source")
        reopen.add_argument("namespace")
        reopen.add_argument("--reason", required=True, help="why (required, recorded)")
        add_as_argument(reopen)
        add_json_argument(reopen)

    def handle(self, *args, **opts):
        getattr(self, f"_{opts['action']}")(opts)

    def _source(self, name: str) -> Source:
        source = Source.objects.filter(name=name).first()
        if source is None:
            raise Refused(f"no source named {shown(name)}", Exit.NOT_FOUND)
        return source

    def _gate(self, opts) -> Gate:
        source = self._source(opts["source"])
        gate = (
            Gate.objects.select_related("source")
            .filter(source=source, namespace=opts["namespace"])
            .first()
        )
        if gate is None:
            raise Refused(
                f"source {source.name} has no gate for {shown(opts['namespace'])}", Exit.NOT_FOUND
            )
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
        serialized = [serialize_gate(gate) for gate in gates]
        if opts["json"]:
            self.stdout.write(dumps({"ok": True, "gates": serialized}))
            return
        rows = [header]
        for g in serialized:
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
            self.stdout.write(dumps({"ok": True, "gate": g}))
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
        user = acting_user(opts["username"], FORCE_REOPEN.perm, "force-reopen gates")
        gate = self._gate(opts)
        try:
            gate = FORCE_REOPEN.run(gate, Actor.for_user(user), ActionInput(reason=opts["reason"]))
        except REFUSALS as exc:
            raise refusal(exc) from None
        if opts["json"]:
            self.stdout.write(dumps({"ok": True, "gate": serialize_gate(gate)}))
            return
        self.stdout.write(
            f"gate {gate.source.name}/{shown(gate.namespace)} force-reopened: {gate.state} "
            f"(by {user.get_username()}, audited)"
        )
