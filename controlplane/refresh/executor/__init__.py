"""The policy refresh executor: lease, concurrent calls, journal, steps and the runner."""

from controlplane.refresh.executor.lease import Lease, LeaseLost
from controlplane.refresh.executor.runner import execute_refresh

__all__ = ["Lease", "LeaseLost", "execute_refresh"]
