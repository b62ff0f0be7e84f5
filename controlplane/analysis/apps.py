from django.apps import AppConfig


class AnalysisConfig(AppConfig):
    name = "controlplane.analysis"
    label = "analysis"
    verbose_name = "Canary analysis"
    default_auto_field = "django.db.models.BigAutoField"
