from django.apps import AppConfig


class RefreshConfig(AppConfig):
    name = "controlplane.refresh"
    label = "refresh"
    verbose_name = "Policy refreshes"

    def ready(self) -> None:
        from controlplane.fleet.signals import discovery_finished
        from controlplane.refresh import freshness

        # Gates follow their source's discovery (`unknown` while it is stale).
        discovery_finished.connect(
            freshness.on_discovery_finished, dispatch_uid="refresh.gate_freshness"
        )
