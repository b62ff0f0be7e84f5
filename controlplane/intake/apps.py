from django.apps import AppConfig


class IntakeConfig(AppConfig):
    name = "controlplane.intake"
    label = "intake"
    verbose_name = "Trainer integration"
