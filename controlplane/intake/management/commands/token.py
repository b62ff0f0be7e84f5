"""`manage.py token create --user NAME --label LABEL [--source S ...] [--expires-days N]`,
`manage.py token revoke LABEL` and `manage.py token list`.

It lives in intake, the API layer that tokens open, rather than in accounts: a token may be
limited to fleet sources, and accounts (a base app) imports no feature app.
"""

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from controlplane.accounts.models import ApiToken
from controlplane.accounts.tokens import create_token, revoke_token
from controlplane.audit.recorder import Actor
from controlplane.fleet.models import Source


class Command(BaseCommand):
    help = "Create, revoke or list API tokens. The secret is printed once, at creation."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="subcommand", required=True)
        create = sub.add_parser("create", help="create a token and print its secret once")
        create.add_argument("--user", required=True)
        create.add_argument("--label", required=True)
        create.add_argument("--source", action="append", default=[], dest="sources")
        create.add_argument("--expires-days", type=int, default=None)
        revoke = sub.add_parser("revoke", help="revoke a token by label")
        revoke.add_argument("label")
        sub.add_parser("list", help="list tokens (never secrets)")

    def handle(self, *args, subcommand, **options):
        actor = Actor.system("manage.py token")
        if subcommand == "create":
            self._create(actor, **options)
        elif subcommand == "revoke":
            token = ApiToken.objects.filter(label=options["label"]).first()
            if token is None:
                raise CommandError(f"no token labelled {options['label']!r}")
            if token.revoked_at is not None:
                raise CommandError(f"token {token.label!r} is already revoked")
            revoke_token(token, actor=actor)
            self.stdout.write(f"revoked {token.label}")
        else:
            for token in ApiToken.objects.select_related("user").prefetch_related("sources"):
                sources = ",".join(s.name for s in token.sources.all()) or "*"
                self.stdout.write(
                    f"{token.label}\t{token.user.get_username()}\t{token.status}\t{sources}"
                )

    def _create(self, actor, *, user, label, sources, expires_days, **_):
        owner = get_user_model().objects.filter(username=user).first()
        if owner is None:
            raise CommandError(f"no user {user!r}")
        found = list(Source.objects.filter(name__in=sources))
        missing = sorted(set(sources) - {s.name for s in found})
        if missing:
            raise CommandError(f"unknown source(s): {', '.join(missing)}")
        try:
            _, secret = create_token(
                user=owner, label=label, actor=actor, sources=found, expires_days=expires_days
            )
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from None
        self.stderr.write(f"created token {label} for {user}; the secret is shown only once:")
        self.stdout.write(secret)
