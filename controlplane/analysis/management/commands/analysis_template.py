"""`manage.py analysis_template list <source>`, `show <source> <name> [--version N]` and
`set <source> <name> --file F [--note TEXT] [--as USER]`.

`set` saves through `analysis.services.save_template`, like the web form and the API: the file
is validated whole and nothing is stored when it does not validate (exit 2). Without `--as` the
audit row names this command as the actor (whoever has shell access may already change
anything); with it, that user's role is checked and the row names them.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError

from controlplane.accounts.management.commands._cli import (
    Exit,
    OperatorCommand,
    Refused,
    acting_user,
    dumps,
    shown,
)
from controlplane.accounts.roles import Perm
from controlplane.analysis import services
from controlplane.analysis.forms import pretty
from controlplane.analysis.spec import MAX_TEMPLATE_BYTES
from controlplane.audit.recorder import Actor
from controlplane.dynamo.jsonsafe import UnsafeJSON, loads_bounded
from controlplane.fleet.models import Source


def _version(text: str) -> int:
    if not text.isascii() or not text.isdigit() or not 1 <= int(text) < 2**31:
        raise argparse.ArgumentTypeError("a version is a whole number from 1")
    return int(text)


class Command(OperatorCommand):
    help = (
        "List, show or set a source's canary analysis templates (each set writes a new "
        "version). Exit codes: 0 ok; 2 bad input (nothing changed); 3 not permitted; "
        "4 no such source, template or version."
    )

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="subcommand", required=True)
        listing = sub.add_parser("list", help="the source's templates at their latest version")
        listing.add_argument("source")
        show = sub.add_parser("show", help="one version's body as JSON (default: the latest)")
        show.add_argument("source")
        show.add_argument("name")
        show.add_argument("--version", type=_version, default=None)
        put = sub.add_parser("set", help="save a template file as the next version")
        put.add_argument("source")
        put.add_argument("name")
        put.add_argument("--file", required=True, help="the template JSON ('-' for stdin)")
        put.add_argument("--note", default="", help="why this version")
        put.add_argument("--as", dest="username", default=None, metavar="USER")
        for p in (listing, show, put):
            p.add_argument("--json", action="store_true", help="print one line of JSON")

    def handle(self, *args, subcommand: str, source: str, **options: Any) -> None:
        found = Source.objects.filter(name=source).first()
        if found is None:
            raise Refused(f"no source named {shown(source)}", Exit.NOT_FOUND)
        if subcommand == "list":
            self._list(found, as_json=options["json"])
        elif subcommand == "show":
            self._show(found, options["name"], options["version"], as_json=options["json"])
        else:
            self._set(found, **options)

    def _list(self, source: Source, *, as_json: bool) -> None:
        rows = [
            {
                "name": t.name,
                "version": t.version,
                "prompts": len(t.body.get("prompts", [])),
                "created_at": t.created_at.isoformat(),
                "created_by": t.created_by,
                "note": t.note,
            }
            for t in services.templates_of(source)
        ]
        if as_json:
            self.stdout.write(dumps({"ok": True, "templates": rows}))
            return
        for r in rows:
            self.stdout.write(
                f"{r['name']}\tv{r['version']}\t{r['prompts']} prompts\t"
                f"{r['created_at']}\t{shown(r['created_by'])}\t{shown(r['note'])}"
            )

    def _show(self, source: Source, name: str, version: int | None, *, as_json: bool) -> None:
        template = services.get_version(source, name, version)
        if template is None:
            what = f"version {version} of " if version else ""
            raise Refused(f"no {what}template {shown(name)} on {source.name}", Exit.NOT_FOUND)
        if as_json:
            answer = {
                "ok": True,
                "source": source.name,
                "name": template.name,
                "version": template.version,
                "created_at": template.created_at.isoformat(),
                "created_by": template.created_by,
                "note": template.note,
                "body": template.body,
            }
            self.stdout.write(dumps(answer))
            return
        self.stderr.write(
            f"{template.name} v{template.version}, saved {template.created_at:%Y-%m-%d %H:%M} "
            f"UTC by {shown(template.created_by)}"
            + (f": {shown(template.note)}" if template.note else "")
        )
        # The body alone on stdout, so `show ... > file` gives a file `set --file` takes back.
        self.stdout.write(pretty(template.body).encode("ascii", "backslashreplace").decode())

    def _set(self, source: Source, *, name: str, file: str, note: str, username, **options):
        actor = (
            Actor.for_user(acting_user(username, Perm.MANAGE_SOURCES, "change analysis templates"))
            if username
            else Actor.system("manage.py analysis_template")
        )
        raw = self._read(file)
        before = services.get_version(source, name)
        try:
            saved = services.save_template(source, name, raw, actor=actor, note=note)
        except PermissionDenied as exc:
            raise Refused(str(exc), Exit.NOT_PERMITTED) from None
        except ValidationError as exc:
            problems = (
                exc.message_dict if hasattr(exc, "error_dict") else {"template": exc.messages}
            )
            lines = "; ".join(f"{k}: {' '.join(m)}" for k, m in problems.items())
            raise Refused(f"not saved: {shown(lines)}", Exit.USAGE, "invalid_template") from None
        created = before is None or before.version != saved.version
        if options["json"]:
            answer = {"ok": True, "name": saved.name, "version": saved.version, "created": created}
            self.stdout.write(dumps(answer))
        elif created:
            self.stdout.write(f"saved {saved.name} v{saved.version}")
        else:
            self.stdout.write(f"unchanged: {saved.name} is already this body at v{saved.version}")

    def _read(self, file: str) -> Any:
        try:
            if file == "-":
                data = sys.stdin.buffer.read(MAX_TEMPLATE_BYTES + 1)
            else:
                with open(file, "rb") as handle:
                    data = handle.read(MAX_TEMPLATE_BYTES + 1)
        except OSError as exc:
            raise Refused(f"cannot read {shown(file)}: {exc.strerror}", Exit.USAGE) from None
        if len(data) > MAX_TEMPLATE_BYTES:
            raise Refused(f"{shown(file)} is larger than {MAX_TEMPLATE_BYTES} bytes", Exit.USAGE)
        try:
            return loads_bounded(
                data, max_depth=settings.JSON_MAX_DEPTH, max_bytes=MAX_TEMPLATE_BYTES
            )
        except UnsafeJSON as exc:
            raise Refused(f"{shown(file)} is not valid JSON: {exc}", Exit.USAGE) from None
