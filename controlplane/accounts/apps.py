from django.apps import AppConfig
from django.db.models.signals import post_migrate

from controlplane.accounts.roles import sync_roles


class AccountsConfig(AppConfig):
    name = "controlplane.accounts"
    label = "accounts"
    verbose_name = "Accounts and roles"

    def ready(self) -> None:
        post_migrate.connect(sync_roles, sender=self, dispatch_uid="accounts.sync_roles")
