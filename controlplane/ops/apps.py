from django.apps import AppConfig


class OpsConfig(AppConfig):
    """Running a deployment: retention (`manage.py purge`), `manage.py doctor`, beat heartbeat.

    The top layer: it reads every app's tables (which rows a live refresh still needs) and
    nothing imports it.
    """

    name = "controlplane.ops"
    label = "ops"
