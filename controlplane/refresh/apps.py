import logging

from django.apps import AppConfig

logger = logging.getLogger(__name__)


def on_discovery_finished(sender, *, source_id, run_id, ok, **kwargs) -> None:
    """Every successful discovery is compared with the gates (refresh/drift.py), in a task:
    receivers must be quick and must not raise."""
    if not ok:
        return
    # Imported here: this module loads before the app registry, and tasks imports models.
    from controlplane.refresh.tasks import reconcile_drift

    try:
        reconcile_drift.delay(source_id, run_id)
    except Exception:  # a broker outage must not fail the discovery that sent this
        logger.exception("could not enqueue drift reconciliation for source %s", source_id)


class RefreshConfig(AppConfig):
    name = "controlplane.refresh"
    label = "refresh"
    verbose_name = "Policy refreshes"

    def ready(self) -> None:
        from controlplane.fleet.signals import discovery_finished

        discovery_finished.connect(on_discovery_finished, dispatch_uid="refresh.drift")

        from controlplane.fleet.metrics import EXTRA_COLLECTORS
        from controlplane.refresh.drift_metrics import DriftCollector
        from controlplane.refresh.refresh_metrics import RefreshCollector

        for collector in (DriftCollector, RefreshCollector):
            if not any(isinstance(c, collector) for c in EXTRA_COLLECTORS):
                EXTRA_COLLECTORS.append(collector())

        from controlplane.refresh import freshness

        # Gates follow their source's discovery (`unknown` while it is stale).
        discovery_finished.connect(
            freshness.on_discovery_finished, dispatch_uid="refresh.gate_freshness"
        )
