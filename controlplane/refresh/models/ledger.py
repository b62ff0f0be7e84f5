"""The serving ledger: per worker instance, append-only intervals of what it serves.

One row is one interval during which everything it says held for one instance: the version it
served and how we know it, whether its gate admitted it and on what grounds, and whether it was
serving, paused, quarantined or gone. A change is a new row; the row it replaces gets its
`valid_to` and is never touched again. Only `controlplane.refresh.ledger` writes these rows;
gates, version windows and provenance are read from them (docs/integrate/gates.md).
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils import timezone

from controlplane.textlimits import CAUSE_CHARS


class Evidence(models.TextChoices):
    """How we know which version an instance serves, strongest first."""

    #: Read back, generation-checked and agreement-checked by policy refresh `refresh`.
    VERIFIED_REFRESH = "verified_refresh", "verified by refresh"
    #: The same checks, run by quarantine catch-up `quarantine`.
    VERIFIED_CATCH_UP = "verified_catch_up", "verified by catch-up"
    #: The worker's own `get_weight_version` readback, no generation check.
    REPORTED = "reported", "reported, unverified"
    #: Taken from the target of an update that the family cannot read back (SGLang).
    ASSUMED = "assumed", "assumed from target, no readback"
    #: Nothing says which version it serves (a fresh joiner that never answered a readback).
    UNKNOWN = "unknown", "unknown"


#: The evidence kinds that count as verified.
VERIFIED_EVIDENCE = frozenset({Evidence.VERIFIED_REFRESH, Evidence.VERIFIED_CATCH_UP})


class Admission(models.TextChoices):
    """Whether the instance's gate admits it, and on what grounds."""

    NOT_ADMITTED = "", "not admitted"
    #: Verified at the version it serves.
    VERIFIED = "verified", "verified"
    #: Admitted by a person without verification (`forced_by`, `forced_at`, `forced_reason`).
    FORCED = "forced", "forced"


class Serving(models.TextChoices):
    """What the instance is doing."""

    SERVING = "serving", "serving"
    PAUSED = "paused", "paused"
    QUARANTINED = "quarantined", "quarantined"
    DEPARTED = "departed", "departed"


class ServingInterval(models.Model):
    """One interval of one instance's serving history (see the module docstring).

    `instance_id` is Dynamo's u64 instance id as decimal text, exactly as `fleet.Worker` keeps
    it. `evidence_detail` holds what backs `evidence` (`{"readback": v, "generation": bool,
    "agreement": "..."}`); `journal_ids` the journal rows (`JournalEntry` or `QuarantineCall`,
    by `evidence`) and `discovery_run` the discovery behind the change; `refresh` and
    `quarantine` are the verification behind `evidence`, `transition_refresh` the refresh that
    is moving the instance while it is in transition; `cause` says in words
    what changed (`refresh #12 verified`, `force-reopened by ...`).
    """

    source = models.ForeignKey("fleet.Source", on_delete=models.CASCADE, related_name="+")
    namespace = models.CharField(max_length=200)
    instance_id = models.CharField(max_length=20)
    key = models.CharField(max_length=700, blank=True)
    #: Shape: `WeightVersion` (controlplane/jsontypes.py).
    version = models.JSONField(null=True, blank=True)
    evidence = models.CharField(max_length=24, choices=Evidence.choices, default=Evidence.UNKNOWN)
    #: Shape: `EvidenceDetail` (refresh/ledger.py).
    evidence_detail = models.JSONField(default=dict, blank=True)
    refresh = models.ForeignKey(
        "PolicyRefresh", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    quarantine = models.ForeignKey(
        "Quarantine", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    #: The refresh moving the instance right now (paused in a wave, left out): in transition.
    transition_refresh = models.ForeignKey(
        "PolicyRefresh", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    admission = models.CharField(
        max_length=16, choices=Admission.choices, blank=True, default=Admission.NOT_ADMITTED
    )
    forced_by = models.CharField(max_length=200, blank=True)
    forced_at = models.DateTimeField(null=True, blank=True)
    forced_reason = models.TextField(blank=True)
    serving = models.CharField(max_length=16, choices=Serving.choices, default=Serving.SERVING)
    valid_from = models.DateTimeField(default=timezone.now)
    valid_to = models.DateTimeField(null=True, blank=True)
    discovery_run = models.ForeignKey(
        "fleet.DiscoveryRun", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    #: Shape: `JournalIds` (controlplane/jsontypes.py).
    journal_ids = models.JSONField(default=list, blank=True)
    cause = models.CharField(max_length=CAUSE_CHARS, blank=True)

    class Meta:
        ordering = ["source", "namespace", "instance_id", "valid_from", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["source", "namespace", "instance_id"],
                condition=Q(valid_to__isnull=True),
                name="serving_interval_one_current",
            )
        ]
        indexes = [
            models.Index(fields=["instance_id", "valid_from"], name="serving_interval_instance"),
            models.Index(
                fields=["source", "namespace"],
                condition=Q(valid_to__isnull=True),
                name="serving_interval_current",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.namespace}/{self.instance_id} {self.version!r} ({self.evidence})"

    @property
    def admitted(self) -> bool:
        return bool(self.admission) and self.serving == Serving.SERVING

    @property
    def verified(self) -> bool:
        return self.evidence in VERIFIED_EVIDENCE
