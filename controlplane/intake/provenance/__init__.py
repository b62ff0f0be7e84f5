"""The provenance trail of a weight version: where it came from and where it went.

One read-only join of what intake, refresh and fleet each know about a version (hence its
home in intake, the top layer): the trainer's checkpoint events that named it, the policy
refreshes that applied it with each worker's outcome, the instances verified at it, and the
admission windows during which a gate admitted rollouts at it. The page
(`/versions/<version>/provenance/`) and the API (`/api/v1/versions/<version>/provenance`)
both render `trail()`; the API answer is the JSON export for data lineage.
"""

from controlplane.intake.provenance.trail import trail, version_key

__all__ = ["trail", "version_key"]
