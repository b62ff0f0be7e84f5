from django.apps import AppConfig

from controlplane import jobs

#: Sent by name: this module loads before the app registry, so it imports no tasks or models.
RECONCILE_DRIFT_TASK = "refresh.reconcile_drift"
#: Policy lag past a source's max (refresh/stale_policy.py), sent by name after a publication.
ENFORCE_LAG_TASK = "refresh.enforce_policy_lag"


def on_discovery_finished(sender, *, source_id, run_id, ok, **kwargs) -> None:
    """Every successful discovery is compared with the gates (refresh/drift.py), in a task:
    receivers must be quick and must not raise."""
    if not ok:
        return
    # A refused send is logged and counted, never raised: a broker outage must not fail the
    # discovery that sent this, and the next discovery compares again.
    jobs.send(RECONCILE_DRIFT_TASK, source_id, run_id)


class RefreshConfig(AppConfig):
    name = "controlplane.refresh"
    label = "refresh"
    verbose_name = "Policy refreshes"

    def ready(self) -> None:
        from controlplane.fleet.signals import discovery_finished

        discovery_finished.connect(on_discovery_finished, dispatch_uid="refresh.drift")

        from controlplane.fleet.metrics import EXTRA_COLLECTORS
        from controlplane.refresh.drift_metrics import DriftCollector
        from controlplane.refresh.lag_metrics import LagCollector
        from controlplane.refresh.refresh_metrics import RefreshCollector

        for collector in (DriftCollector, RefreshCollector, LagCollector):
            if not any(isinstance(c, collector) for c in EXTRA_COLLECTORS):
                EXTRA_COLLECTORS.append(collector())

        from controlplane.refresh import freshness

        # Gates follow their source's discovery (`unknown` while it is stale).
        discovery_finished.connect(
            freshness.on_discovery_finished, dispatch_uid="refresh.gate_freshness"
        )
