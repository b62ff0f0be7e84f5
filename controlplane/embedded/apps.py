from django.apps import AppConfig


class EmbeddedConfig(AppConfig):
    name = "controlplane.embedded"
    label = "embedded"
    verbose_name = "Embedded runtime"
