"""Trainer webhook endpoints and every webhook they received."""

from django.db import models


class WebhookPolicy(models.TextChoices):
    AUTO_START = "auto_start", "Start the policy refresh automatically"
    REQUIRE_APPROVAL = "require_approval", "Create a refresh awaiting approval"


class WebhookEndpoint(models.Model):
    """One trainer's webhook: which source and namespaces it may refresh, and how.

    `secrets` holds one or more `whsec_` secrets; during rotation both old and new are listed and
    a signature by either is accepted. `rules` are optional conditions on the event's metrics
    that force approval, e.g. `[{"metric": "eval/reward", "op": "lt", "value": 0.2}]`.
    """

    name = models.SlugField(max_length=64, unique=True)
    source = models.ForeignKey(
        "fleet.Source", on_delete=models.CASCADE, related_name="webhook_endpoints"
    )
    # Empty: the source's whole scope.
    namespaces = models.JSONField(default=list, blank=True)
    secrets = models.JSONField(default=list)
    policy = models.CharField(
        max_length=32, choices=WebhookPolicy.choices, default=WebhookPolicy.REQUIRE_APPROVAL
    )
    rules = models.JSONField(default=list, blank=True)
    pause_mode = models.CharField(max_length=32, default="keep")
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class ReceivedWebhookOutcome(models.TextChoices):
    PROCESSING = "processing"
    STARTED = "started"
    AWAITING_APPROVAL = "awaiting_approval"
    # Planned, left for an operator to start (approval wanted but not expressible, see receive).
    PLANNED = "planned"
    PLAN_BLOCKED = "plan_blocked"
    CONFLICT = "conflict"
    FAILED = "failed"
    TEST = "test"


class ReceivedWebhook(models.Model):
    """A verified webhook, remembered by its `webhook-id` so a replay never acts twice.

    Only signed requests are stored here (rejections go to the audit log, where an attacker
    cannot fill a table by spraying garbage at the endpoint).
    """

    endpoint = models.ForeignKey(WebhookEndpoint, on_delete=models.CASCADE, related_name="received")
    webhook_id = models.CharField(max_length=200)
    event_type = models.CharField(max_length=64)
    received_at = models.DateTimeField(auto_now_add=True, db_index=True)
    payload = models.JSONField(default=dict)
    outcome = models.CharField(
        max_length=32,
        choices=ReceivedWebhookOutcome.choices,
        default=ReceivedWebhookOutcome.PROCESSING,
    )
    detail = models.TextField(blank=True)
    response = models.JSONField(default=dict, blank=True)
    refresh_id = models.BigIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["-received_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["endpoint", "webhook_id"], name="received_webhook_unique_id"
            )
        ]

    def __str__(self) -> str:
        return f"{self.endpoint.name} {self.webhook_id}"
