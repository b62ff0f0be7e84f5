"""Outbound notification destinations, one delivery per (destination, event), every attempt.

The tables keep the names they had when these models lived in `intake` (`db_table` below), so
moving the models to this app moved no data.
"""

import uuid

from django.db import models


class NotificationEvent(models.TextChoices):
    REFRESH_AWAITING_APPROVAL = "refresh.awaiting_approval"
    REFRESH_SUCCEEDED = "refresh.succeeded"
    REFRESH_HELD = "refresh.held"
    # Every rank of a distributed refresh joined the group: the trainer may broadcast now.
    REFRESH_GROUP_READY = "refresh.group_ready"
    # An external refresh paused its workers: the trainer applies the weights now and reports
    # `applied` (carries the worker set and the deadline).
    REFRESH_READY_FOR_APPLY = "refresh.ready_for_apply"
    # A canary passed its own checks and waits for a verdict (carries its verified instance
    # set); a staged refresh waits at a pause point until a person continues it.
    REFRESH_CANARY_REVIEW = "refresh.canary_review"
    REFRESH_WAITING = "refresh.waiting"
    # A canary analysis concluded (canary phase), or the watch after a reopen found a breach
    # (background phase): carries the outcome, the score and the report's link.
    REFRESH_ANALYSIS_DONE = "refresh.analysis_done"
    GATE_FORCE_REOPENED = "gate.force_reopened"
    # A gate entered a state: one notification per source and change, listing its gates.
    GATE_OPENED = "gate.opened"
    GATE_CLOSED = "gate.closed"
    GATE_UNKNOWN = "gate.unknown"
    SOURCE_STALE = "source.stale"
    # Drift between refreshes (refresh/drift.py, refresh/quarantine.py): a drifted worker was
    # quarantined, caught up and admitted back, or could not be (paused or caught up).
    DRIFT_QUARANTINED = "drift.quarantined"
    DRIFT_ADMITTED = "drift.admitted"
    DRIFT_FAILED = "drift.failed"
    # A namespace serves a policy more steps behind the trainer's latest than its source
    # allows (`max_lag_action=alert`; refresh/stale_policy.py).
    POLICY_LAG_EXCEEDED = "policy.lag_exceeded"
    # Signed checkpoints of the audit chain head; only destinations that select it get it.
    AUDIT_CHECKPOINT = "audit.checkpoint"
    TEST = "test"


class DestinationKind(models.TextChoices):
    WEBHOOK = "webhook", "Generic JSON webhook (Standard Webhooks signed)"
    SLACK = "slack", "Slack-compatible incoming webhook"


class NotificationDestination(models.Model):
    """Where notifications go: a signed JSON webhook or a Slack-style incoming webhook.

    Like Dynamo sources, a destination carries its own allowlist of networks; an empty list
    allows nothing, so a destination nobody scoped can never reach an internal address.
    """

    name = models.SlugField(max_length=64, unique=True)
    kind = models.CharField(max_length=16, choices=DestinationKind.choices)
    url = models.URLField(max_length=500)
    # `whsec_<base64>`; signs generic webhooks. Unused for Slack, whose URL is the secret.
    secret = models.CharField(max_length=200, blank=True)
    #: Shape: `Networks` (controlplane/jsontypes.py).
    allowed_networks = models.JSONField(default=list, blank=True)
    # Empty means every event.
    #: Shape: `EventNames` (controlplane/jsontypes.py).
    events = models.JSONField(default=list, blank=True)
    # Null means every source.
    source = models.ForeignKey(
        "fleet.Source",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="notification_destinations",
    )
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "intake_notificationdestination"
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def wants(self, event: str, source_id: int | None) -> bool:
        if not self.enabled:
            return False
        if self.events and event not in self.events and event != NotificationEvent.TEST:
            return False
        return not (self.source_id is not None and source_id not in (None, self.source_id))


class DeliveryStatus(models.TextChoices):
    PENDING = "pending"
    RETRYING = "retrying"
    DELIVERED = "delivered"
    FAILED = "failed"


class NotificationDelivery(models.Model):
    """One notification for one destination. `message_id` stays the same across retries, so
    a receiver that deduplicates on `webhook-id` sees a retry as the same message."""

    destination = models.ForeignKey(
        NotificationDestination, on_delete=models.CASCADE, related_name="deliveries"
    )
    message_id = models.CharField(max_length=64, unique=True, default="")
    event = models.CharField(max_length=64)
    #: Shape: `OpaqueJson` (controlplane/jsontypes.py): the message as sent.
    payload = models.JSONField(default=dict)
    status = models.CharField(
        max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING
    )
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "intake_notificationdelivery"
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["destination", "-created_at"], name="ndelivery_dest_idx")]

    def __str__(self) -> str:
        return f"{self.event} to {self.destination.name} ({self.status})"

    def save(self, *args, **kwargs):
        if not self.message_id:
            self.message_id = f"msg_{uuid.uuid4().hex}"
        super().save(*args, **kwargs)


class NotificationAttempt(models.Model):
    """One HTTP attempt of a delivery: what the destination answered, or why it was not sent."""

    delivery = models.ForeignKey(
        NotificationDelivery, on_delete=models.CASCADE, related_name="attempt_log"
    )
    number = models.PositiveIntegerField()
    attempted_at = models.DateTimeField()
    status_code = models.PositiveIntegerField(null=True, blank=True)
    ok = models.BooleanField(default=False)
    error = models.TextField(blank=True)
    duration_ms = models.FloatField(null=True, blank=True)
    response_excerpt = models.TextField(blank=True)

    class Meta:
        db_table = "intake_notificationattempt"
        ordering = ["delivery", "number"]
        constraints = [
            models.UniqueConstraint(fields=["delivery", "number"], name="nattempt_unique_number")
        ]

    def __str__(self) -> str:
        return f"attempt {self.number} of delivery {self.delivery_id}"
