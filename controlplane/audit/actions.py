"""Every audited action, by name. Names are `<noun>.<past-tense verb>` and never change meaning."""

from django.db import models


class AuditAction(models.TextChoices):
    # accounts
    USER_CREATED = "user.created"
    USER_ROLE_CHANGED = "user.role_changed"
    LOGIN_SUCCEEDED = "auth.login_succeeded"
    LOGIN_FAILED = "auth.login_failed"
    LOGIN_THROTTLED = "auth.login_throttled"
    LOGGED_OUT = "auth.logged_out"
    TOKEN_CREATED = "token.created"
    TOKEN_REVOKED = "token.revoked"
    # sources and discovery
    SOURCE_CREATED = "source.created"
    SOURCE_UPDATED = "source.updated"
    SOURCE_REMOVED = "source.removed"
    SOURCE_WENT_STALE = "source.went_stale"
    SOURCE_RECOVERED = "source.recovered"
    STATIC_WORKER_ADDED = "static_worker.added"
    STATIC_WORKER_REMOVED = "static_worker.removed"
    DISCOVERY_REQUESTED = "discovery.requested"
    DISCOVERY_MEMBERSHIP_CHANGED = "discovery.membership_changed"
    # gates and policy refreshes
    GATE_CLOSED = "gate.closed"
    GATE_OPENED = "gate.opened"
    GATE_FORCE_REOPENED = "gate.force_reopened"
    POLICY_REFRESH_PLANNED = "policy_refresh.planned"
    POLICY_REFRESH_REQUESTED = "policy_refresh.requested"
    POLICY_REFRESH_APPROVED = "policy_refresh.approved"
    POLICY_REFRESH_REJECTED = "policy_refresh.rejected"
    POLICY_REFRESH_STARTED = "policy_refresh.started"
    POLICY_REFRESH_STEP_STARTED = "policy_refresh.step_started"
    POLICY_REFRESH_STEP_SUCCEEDED = "policy_refresh.step_succeeded"
    POLICY_REFRESH_STEP_FAILED = "policy_refresh.step_failed"
    POLICY_REFRESH_HELD = "policy_refresh.held"
    POLICY_REFRESH_RETRIED = "policy_refresh.retried"
    POLICY_REFRESH_ROLLED_BACK = "policy_refresh.rolled_back"
    POLICY_REFRESH_ABORTED = "policy_refresh.aborted"
    POLICY_REFRESH_SUCCEEDED = "policy_refresh.succeeded"
    POLICY_REFRESH_FAILED = "policy_refresh.failed"
    POLICY_REFRESH_RECOVERED = "policy_refresh.recovered"
    # trainer integration
    WEBHOOK_ENDPOINT_CREATED = "webhook_endpoint.created"
    WEBHOOK_ENDPOINT_UPDATED = "webhook_endpoint.updated"
    WEBHOOK_ENDPOINT_REMOVED = "webhook_endpoint.removed"
    WEBHOOK_ENDPOINT_TEST_SENT = "webhook_endpoint.test_sent"
    WEBHOOK_ACCEPTED = "webhook.accepted"
    WEBHOOK_REJECTED = "webhook.rejected"
    WEBHOOK_REPLAYED = "webhook.replayed"
    NOTIFICATION_DESTINATION_CREATED = "notification_destination.created"
    NOTIFICATION_DESTINATION_UPDATED = "notification_destination.updated"
    NOTIFICATION_DESTINATION_REMOVED = "notification_destination.removed"
    NOTIFICATION_DESTINATION_TEST_SENT = "notification_destination.test_sent"
    API_REQUEST = "api.request"


class ActorType(models.TextChoices):
    USER = "user"
    TOKEN = "token"
    WEBHOOK = "webhook"
    SYSTEM = "system"
