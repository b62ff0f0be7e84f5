"""Discovery refresh: observe a source's fleet (network), then store, diff, audit, publish."""

from controlplane.fleet.discovery.runner import run_discovery

__all__ = ["run_discovery"]
