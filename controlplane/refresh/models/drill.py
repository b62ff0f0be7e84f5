"""The record of one rollback drill (a refresh model, re-exported by `refresh.models`)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from controlplane.textlimits import LABEL_CHARS


class DrillPhase(models.TextChoices):
    #: The subset is being refreshed to the previous verified policy.
    FORWARD = "forward"
    #: The subset is being refreshed back to the current policy and re-admitted.
    BACK = "back"
    DONE = "done"


class DrillOutcome(models.TextChoices):
    RUNNING = "running"
    #: Both directions verified: rollback is proven, with both durations recorded.
    SUCCEEDED = "succeeded"
    #: A direction did not verify (or could not start); `reason` says why and `next_step`
    #: what a person does about the subset.
    FAILED = "failed"


class DrillRun(models.Model):
    """One rollback drill of a source: a small subset of its scope refreshed to the policy
    verified before the current one (`previous_policy`) and back (`current_policy`).

    Each direction is an ordinary policy refresh restricted to `instances` (the rest keep
    serving and stay verified), so the journal, grid and audit of both are the refresh pages'.
    `forward_seconds` and `back_seconds` are each refresh's first step start to its end.
    `claimed_until` is the conditional-UPDATE claim of whoever advances the drill; `updated_at`
    moves on every advance, so a drill whose task chain died is found by the reconciler.
    """

    source = models.ForeignKey("fleet.Source", on_delete=models.CASCADE, related_name="drills")
    #: Shape: `Namespaces` (controlplane/jsontypes.py).
    namespaces = models.JSONField(default=list)
    #: The instance ids (decimal strings) drilled, across `namespaces`.
    #: Shape: `InstanceIds` (controlplane/jsontypes.py).
    instances = models.JSONField(default=list)
    #: Shape: `DrillPolicy` (refresh/targets.py).
    current_policy = models.JSONField()
    #: Shape: `DrillPolicy` (refresh/targets.py).
    previous_policy = models.JSONField()
    #: True when the source's drill schedule started it.
    scheduled = models.BooleanField(default=False)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    requested_by_label = models.CharField(max_length=LABEL_CHARS, blank=True)

    phase = models.CharField(max_length=16, choices=DrillPhase.choices, default="forward")
    outcome = models.CharField(
        max_length=16, choices=DrillOutcome.choices, default="running", db_index=True
    )
    reason = models.TextField(blank=True)
    next_step = models.TextField(blank=True)

    forward_refresh = models.ForeignKey(
        "refresh.PolicyRefresh", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    back_refresh = models.ForeignKey(
        "refresh.PolicyRefresh", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    forward_seconds = models.FloatField(null=True, blank=True)
    back_seconds = models.FloatField(null=True, blank=True)

    started_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)
    claimed_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["source"],
                condition=models.Q(outcome="running"),
                name="drill_one_running_per_source",
            )
        ]

    def __str__(self) -> str:
        return f"drill #{self.pk} {self.source_id} ({self.outcome})"

    @property
    def correlation_id(self) -> str:
        return f"drill-{self.pk}"

    @property
    def is_running(self) -> bool:
        return self.outcome == DrillOutcome.RUNNING

    @property
    def previous_version(self):
        return (self.previous_policy or {}).get("weight_version")

    @property
    def current_version(self):
        return (self.current_policy or {}).get("weight_version")
