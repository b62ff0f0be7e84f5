from django.apps import AppConfig


class RefreshConfig(AppConfig):
    name = "controlplane.refresh"
    label = "refresh"
    verbose_name = "Policy refreshes"
