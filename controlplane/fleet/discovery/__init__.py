"""Discovery refresh: observe a source's fleet (network), then store, diff, audit, publish."""

from controlplane.fleet.discovery.runner import refresh_source

__all__ = ["refresh_source"]
