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
    #: Shape: `Namespaces` (controlplane/jsontypes.py).
    namespaces = models.JSONField(default=list, blank=True)
    #: Shape: `Secrets` (intake/services/endpoints.py).
    secrets = models.JSONField(default=list)
    policy = models.CharField(
        max_length=32, choices=WebhookPolicy.choices, default=WebhookPolicy.REQUIRE_APPROVAL
    )
    #: Shape: `list[ApprovalRule]` (intake/webhooks/trainer/events.py).
    rules = models.JSONField(default=list, blank=True)
    pause_mode = models.CharField(max_length=32, default="auto")
    #: The endpoint's plans declare that requests in flight may straddle the update (needed by
    #: a pause mode that keeps them, `refresh.targets.KEEPING_MODES`).
    inflight_may_straddle = models.BooleanField(default=False)
    #: The strategy of the refreshes this endpoint's checkpoints ask for (the
    #: `refresh.strategy` JSON form); empty = the source's default strategy.
    #: Shape: `StrategyJson` (refresh/strategy.py).
    default_strategy = models.JSONField(default=dict, blank=True)
    #: Whether a `checkpoint.ready` may name its own `strategy`. Off by default: the people
    #: who configure the endpoint decide how fast a trainer may roll the fleet, not the trainer.
    allow_strategy_override = models.BooleanField(default=False)
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class DeliveryState(models.TextChoices):
    """Where a received webhook is on its way to an outcome (the outcomes table in
    docs/integrate/trainer.md)."""

    QUEUED = "queued"  # stored and audited; the Celery task will plan it
    PROCESSING = "processing"  # a task is planning/starting it now
    RETRYING = "retrying"  # a transient failure; the task tries again at `next_attempt_at`
    # Transient failures outlasted our retries: a repeat with the same webhook id re-runs it.
    RETRYABLE = "retryable"
    DONE = "done"  # terminal: `outcome` says how it ended; a repeat is `already_processed`


#: States a trainer's repeat answers with 202 and the current state (not `already_processed`).
PENDING_STATES = (DeliveryState.QUEUED, DeliveryState.PROCESSING, DeliveryState.RETRYING)


class ReceivedWebhookOutcome(models.TextChoices):
    """How a delivery ended (state `done`). Empty while it has not."""

    NONE = "", "none yet"
    STARTED = "started"
    AWAITING_APPROVAL = "awaiting_approval"
    # Planned, left for an operator to start (approval wanted but not expressible, see receive).
    PLANNED = "planned"
    PLAN_BLOCKED = "plan_blocked"
    # A later checkpoint for the same scope arrived before this one could start.
    SUPERSEDED = "superseded"
    FAILED = "failed"
    TEST = "test"
    # A `broadcast.done` recorded on its distributed refresh.
    BROADCAST_DONE = "broadcast_done"
    # A `canary.verdict` recorded on its canary (passed or failed: the detail says which).
    CANARY_VERDICT = "canary_verdict"
    # A `policy.published` recorded as a published policy (fleet.PublishedPolicy).
    POLICY_PUBLISHED = "policy_published"
    # A `refresh.applied` recorded on its external refresh (per worker or for all).
    APPLIED = "applied"
    # Only on rows stored before webhooks were processed in the background.
    PROCESSING = "processing"
    CONFLICT = "conflict"


class ReceivedWebhook(models.Model):
    """A verified webhook (a delivery), remembered by its `webhook-id` so a replay never acts
    twice, with its progress: state, attempts, last error and, once done, its outcome.

    Only signed requests are stored here (rejections go to the audit log, where an attacker
    cannot fill a table by spraying garbage at the endpoint).
    """

    endpoint = models.ForeignKey(WebhookEndpoint, on_delete=models.CASCADE, related_name="received")
    webhook_id = models.CharField(max_length=200)
    event_type = models.CharField(max_length=64)
    received_at = models.DateTimeField(auto_now_add=True, db_index=True)
    updated_at = models.DateTimeField(auto_now=True)
    #: Shape: `OpaqueJson` (controlplane/jsontypes.py): the trainer's envelope as received.
    payload = models.JSONField(default=dict)
    # A signed repeat must carry the same body; a different one is refused (409).
    body_sha256 = models.CharField(max_length=64, blank=True)
    state = models.CharField(
        max_length=16, choices=DeliveryState.choices, default=DeliveryState.QUEUED
    )
    outcome = models.CharField(
        max_length=32,
        choices=ReceivedWebhookOutcome.choices,
        default=ReceivedWebhookOutcome.NONE,
        blank=True,
    )
    attempts = models.PositiveIntegerField(default=0)
    # Retrying stops (state `retryable`) once `attempts` reaches this; a trainer repeat raises it.
    attempt_limit = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    detail = models.TextField(blank=True)
    #: Shape: `WebhookResponse` (intake/webhooks/trainer/events.py).
    response = models.JSONField(default=dict, blank=True)
    refresh_id = models.BigIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["-received_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["endpoint", "webhook_id"], name="received_webhook_unique_id"
            )
        ]
        indexes = [models.Index(fields=["webhook_id"], name="received_webhook_id_idx")]

    def __str__(self) -> str:
        return f"{self.endpoint.name} {self.webhook_id}"

    @property
    def terminal(self) -> bool:
        return self.state == DeliveryState.DONE
