from django.apps import AppConfig


class IntakeConfig(AppConfig):
    name = "controlplane.intake"
    label = "intake"
    verbose_name = "Trainer integration"

    def ready(self) -> None:
        # Imported here: this module loads before the app registry, and these import models.
        from controlplane.fleet.metrics import EXTRA_COLLECTORS
        from controlplane.intake.webhook_metrics import WebhookCollector

        if not any(isinstance(c, WebhookCollector) for c in EXTRA_COLLECTORS):
            EXTRA_COLLECTORS.append(WebhookCollector())
