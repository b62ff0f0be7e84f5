"""Django app config: only contributes the `simfleet` management command."""

from django.apps import AppConfig


class SimfleetConfig(AppConfig):
    name = "controlplane.simfleet"
    label = "simfleet"
    verbose_name = "Simulated Dynamo fleet"
