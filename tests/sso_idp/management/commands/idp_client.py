from django.core.management.base import BaseCommand
from oauth2_provider.models import Application


class Command(BaseCommand):
    help = "Register the control plane as a confidential client (authorization code, RS256)."

    def add_arguments(self, parser):
        parser.add_argument("client_id")
        parser.add_argument("client_secret")
        parser.add_argument("redirect_uri")

    def handle(self, client_id, client_secret, redirect_uri, **options):
        Application.objects.update_or_create(
            client_id=client_id,
            defaults={
                "name": "control plane",
                "client_secret": client_secret,
                "client_type": Application.CLIENT_CONFIDENTIAL,
                "authorization_grant_type": Application.GRANT_AUTHORIZATION_CODE,
                "redirect_uris": redirect_uri,
                "algorithm": Application.RS256_ALGORITHM,
                "skip_authorization": True,
            },
        )
