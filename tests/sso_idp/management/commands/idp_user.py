from django.contrib.auth.models import Group, User
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create or update a person at the test provider, with exactly these groups."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("password")
        parser.add_argument("--groups", default="")

    def handle(self, username, password, groups, **options):
        user, _ = User.objects.get_or_create(username=username)
        user.email = f"{username}@example.test"
        user.set_password(password)
        user.save()
        names = [g for g in groups.split(",") if g]
        user.groups.set([Group.objects.get_or_create(name=n)[0] for n in names])
        self.stdout.write(str(user.pk))
