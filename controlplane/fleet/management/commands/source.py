"""`manage.py source add|list|remove|max-lag|add-static|remove-static` — sources from the
command line.

Goes through the same services as the UI, so input is validated the same way and every change
is audited (actor: the system user `cli:<os user>`).
"""

from __future__ import annotations

import getpass

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from controlplane.audit.recorder import Actor
from controlplane.fleet import services
from controlplane.fleet.models import FAMILY_CHOICES, Source, StaticWorker


def _actor() -> Actor:
    try:
        who = getpass.getuser()
    except Exception:  # no passwd entry in some containers
        who = "unknown"
    return Actor.system(f"cli:{who}")


def _one_line(exc: ValidationError) -> str:
    if hasattr(exc, "error_dict"):
        return "; ".join(f"{f}: {' '.join(m)}" for f, m in exc.message_dict.items())
    return "; ".join(exc.messages)


def _max_lag_arguments(parser, *, defaults: bool) -> None:
    parser.add_argument(
        "--max-lag",
        choices=["observe", "alert", "close"],
        default="observe" if defaults else None,
        help="past the max lag: observe, alert (notify) or close the gate as stale_policy"
        + (" (default observe)" if defaults else ""),
    )
    parser.add_argument(
        "--max-lag-steps",
        type=int,
        default=1 if defaults else None,
        metavar="STEPS",
        help="training steps the served policy may be behind the latest published one"
        + (" (default 1)" if defaults else ""),
    )


class Command(BaseCommand):
    help = "Manage discovery sources and their static workers."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        add = sub.add_parser("add", help="register a source")
        add.add_argument("name")
        add.add_argument("--listener-url", required=True)
        add.add_argument("--frontend-url", default="")
        add.add_argument(
            "--admin-network",
            action="append",
            default=[],
            metavar="CIDR",
            help="allowed admin network (repeat for several)",
        )
        add.add_argument("--interval", type=float, default=10.0, metavar="SECONDS")
        add.add_argument("--require-approval", action="store_true")
        add.add_argument("--expected-namespace", default="")
        add.add_argument("--expected-prefix", default="")
        add.add_argument("--expected-worker-suffix", default="")
        add.add_argument(
            "--listener-scope",
            default="",
            choices=["", "exact", "prefix", "suffix", "global"],
            help="the declared listener scope; workers outside it are refused",
        )
        add.add_argument("--disabled", action="store_true")
        add.add_argument(
            "--if-absent",
            action="store_true",
            help="do nothing if a source of this name exists (for start-up scripts)",
        )
        add.add_argument(
            "--agreement-rule",
            choices=["exact", "logprob"],
            default="exact",
            help="how workers of one model must agree after an update (default exact)",
        )
        add.add_argument(
            "--agreement-tokens",
            type=int,
            default=8,
            metavar="K",
            help="compare the first K completion tokens (default 8)",
        )
        add.add_argument(
            "--agreement-epsilon",
            type=float,
            default=0.05,
            metavar="EPS",
            help="logprob rule: largest allowed chosen-token logprob difference (default 0.05)",
        )
        add.add_argument(
            "--drift-policy",
            choices=["quarantine", "close", "observe"],
            default="quarantine",
            help="what a worker that drifts from its gate's policy does (default quarantine)",
        )
        add.add_argument(
            "--drill-every",
            type=int,
            default=0,
            metavar="HOURS",
            help="hours between scheduled rollback drills (default 0: never)",
        )
        _max_lag_arguments(add, defaults=True)
        max_lag = sub.add_parser(
            "max-lag", help="set what a namespace serving an old policy does (policy lag)"
        )
        max_lag.add_argument("name")
        _max_lag_arguments(max_lag, defaults=False)
        sub.add_parser("list", help="list sources")
        remove = sub.add_parser("remove", help="remove a source and its history")
        remove.add_argument("name")
        static = sub.add_parser("add-static", help="add a static worker to a source")
        static.add_argument("source")
        static.add_argument("name")
        static.add_argument("--namespace", required=True)
        static.add_argument("--system-url", required=True)
        static.add_argument("--family", required=True, choices=[c for c, _ in FAMILY_CHOICES])
        static.add_argument(
            "--route",
            action="append",
            default=[],
            dest="routes",
            help="allowlisted engine route (repeat for several)",
        )
        static.add_argument("--component", default="backend")
        static.add_argument("--model", default="")
        static.add_argument(
            "--endpoint", default="generate", help="endpoint it registers with the frontend"
        )
        static.add_argument(
            "--declared-instance-id",
            default="",
            help="its instance id, where several of the frontend's /health instances match",
        )
        remove_static = sub.add_parser("remove-static", help="remove a static worker")
        remove_static.add_argument("source")
        remove_static.add_argument("name")

    def handle(self, *args, action: str, **opts):
        try:
            getattr(self, "_" + action.replace("-", "_"))(opts)
        except ValidationError as exc:
            raise CommandError(_one_line(exc)) from None

    def _max_lag(self, o):
        changes = {
            k: v
            for k, v in (("max_lag_action", o["max_lag"]), ("max_lag_steps", o["max_lag_steps"]))
            if v is not None
        }
        if not changes:
            raise CommandError("give --max-lag and/or --max-lag-steps")
        source = services.update_source(self._source(o["name"]), actor=_actor(), **changes)
        self.stdout.write(
            f"source {source.name}: on policy lag {source.max_lag_action} "
            f"past {source.max_lag_steps} step(s)"
        )

    def _source(self, name: str) -> Source:
        try:
            return Source.objects.get(name=name)
        except Source.DoesNotExist:
            raise CommandError(f"no source named {name!r}") from None

    def _add(self, o):
        if o["if_absent"] and Source.objects.filter(name=o["name"]).exists():
            self.stdout.write(f"source {o['name']} exists; left as it is")
            return
        source = services.create_source(
            actor=_actor(),
            name=o["name"],
            listener_url=o["listener_url"],
            frontend_url=o["frontend_url"],
            allowed_networks=o["admin_network"],
            discovery_interval_seconds=o["interval"],
            require_approval=o["require_approval"],
            expected_namespace=o["expected_namespace"],
            expected_prefix=o["expected_prefix"],
            expected_worker_suffix=o["expected_worker_suffix"],
            listener_scope=o["listener_scope"],
            enabled=not o["disabled"],
            agreement_rule=o["agreement_rule"],
            agreement_tokens=o["agreement_tokens"],
            agreement_epsilon=o["agreement_epsilon"],
            drift_policy=o["drift_policy"],
            drill_every=o["drill_every"],
            max_lag_action=o["max_lag"],
            max_lag_steps=o["max_lag_steps"],
        )
        self.stdout.write(f"created source {source.name} (id {source.pk})")

    def _list(self, o):
        rows = [("NAME", "LISTENER", "NETWORKS", "INTERVAL", "APPROVAL", "STATE")]
        for s in Source.objects.all():
            state = "stale: " + s.stale_reason if s.stale else ("ok" if s.enabled else "disabled")
            rows.append(
                (
                    s.name,
                    s.listener_url,
                    ",".join(s.allowed_networks),
                    f"{s.discovery_interval_seconds:g}s",
                    "yes" if s.require_approval else "no",
                    state,
                )
            )
        self.stdout.write(format_table(rows))

    def _remove(self, o):
        source = self._source(o["name"])
        services.remove_source(source, actor=_actor())
        self.stdout.write(f"removed source {o['name']}")

    def _add_static(self, o):
        source = self._source(o["source"])
        static = services.add_static_worker(
            source,
            actor=_actor(),
            name=o["name"],
            namespace=o["namespace"],
            system_url=o["system_url"],
            family=o["family"],
            allowed_routes=o["routes"],
            component=o["component"],
            model=o["model"],
            endpoint=o["endpoint"],
            declared_instance_id=o["declared_instance_id"],
        )
        self.stdout.write(f"added static worker {static} ({', '.join(static.allowed_routes)})")

    def _remove_static(self, o):
        source = self._source(o["source"])
        try:
            static = source.static_workers.get(name=o["name"])
        except StaticWorker.DoesNotExist:
            raise CommandError(f"source {source.name} has no static worker {o['name']!r}") from None
        services.remove_static_worker(static, actor=_actor())
        self.stdout.write(f"removed static worker {o['name']}")


def format_table(rows: list[tuple]) -> str:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )
