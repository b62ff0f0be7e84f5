import json

from django.contrib.auth.models import Group, User
from django.core.management.base import BaseCommand

from tests.sso_idp import tweaks


class Command(BaseCommand):
    help = "Create or update a person at the test provider, with exactly these groups."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("password")
        parser.add_argument("--groups", default="")
        parser.add_argument(
            "--id-token",
            default="{}",
            help="JSON claims laid over their ID tokens (exp/iat: seconds from now)",
        )

    def handle(self, username, password, groups, id_token, **options):
        user, _ = User.objects.get_or_create(username=username)
        user.email = f"{username}@example.test"
        user.set_password(password)
        user.save()
        names = [g for g in groups.split(",") if g]
        user.groups.set([Group.objects.get_or_create(name=n)[0] for n in names])
        tweaks.save(username, json.loads(id_token))
        self.stdout.write(str(user.pk))
