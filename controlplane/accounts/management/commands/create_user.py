"""`manage.py create_user NAME --role operator [--password-stdin]`."""

import getpass
import sys

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from controlplane.accounts.roles import Role
from controlplane.accounts.services import create_user_with_role


class Command(BaseCommand):
    help = "Create a user with one role (viewer, operator, approver, admin)."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--role", required=True, choices=[r.value for r in Role])
        parser.add_argument(
            "--password-stdin",
            action="store_true",
            help="read the password from the first line of standard input",
        )

    def handle(self, *args, username, role, password_stdin, **options):
        if get_user_model().objects.filter(username=username).exists():
            raise CommandError(f"user {username!r} already exists")
        if password_stdin:
            password = sys.stdin.readline().rstrip("\n")
        else:
            password = getpass.getpass("Password: ")
            if password != getpass.getpass("Password (again): "):
                raise CommandError("passwords do not match")
        if not password:
            raise CommandError("password must not be empty")
        try:
            create_user_with_role(username, Role(role), password)
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from None
        self.stdout.write(f"created {username} ({role})")
