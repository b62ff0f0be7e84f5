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
    GATE_UNKNOWN = "gate.unknown"
    GATE_KNOWN = "gate.known"
    # staged refreshes (refresh/strategy.py): the gate keeps the old set while waves run
    GATE_STAGED = "gate.staged"
    GATE_WAVE_VERIFIED = "gate.wave_verified"
    # drift between refreshes (refresh/drift.py, refresh/quarantine.py)
    GATE_DRIFT_RECORDED = "gate.drift_recorded"
    GATE_RECONCILED = "gate.reconciled"
    GATE_INSTANCE_ADMITTED = "gate.instance_admitted"
    QUARANTINE_STARTED = "quarantine.started"
    QUARANTINE_CATCH_UP_STARTED = "quarantine.catch_up_started"
    QUARANTINE_ADMITTED = "quarantine.admitted"
    QUARANTINE_FAILED = "quarantine.failed"
    QUARANTINE_RETRIED = "quarantine.retried"
    QUARANTINE_RELEASED = "quarantine.released"
    QUARANTINE_DROPPED = "quarantine.dropped"
    QUARANTINE_REQUEUED = "quarantine.requeued"
    QUARANTINE_SUPERSEDED = "quarantine.superseded"
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
    POLICY_REFRESH_DISCARDED = "policy_refresh.discarded"
    POLICY_REFRESH_SUCCEEDED = "policy_refresh.succeeded"
    POLICY_REFRESH_FAILED = "policy_refresh.failed"
    POLICY_REFRESH_RECOVERED = "policy_refresh.recovered"
    POLICY_REFRESH_WORKERS_DEPARTED = "policy_refresh.workers_departed"
    POLICY_REFRESH_ENDED = "policy_refresh.ended"
    POLICY_REFRESH_MEMBERSHIP_RESOLVED = "policy_refresh.membership_resolved"
    POLICY_REFRESH_NAMESPACES_REOPENED = "policy_refresh.namespaces_reopened"
    # strategies (refresh/strategy.py, refresh/waves.py, refresh/canary.py)
    POLICY_REFRESH_WAVE_VERIFIED = "policy_refresh.wave_verified"
    POLICY_REFRESH_WAITING = "policy_refresh.waiting"
    POLICY_REFRESH_PAUSE_REQUESTED = "policy_refresh.pause_requested"
    POLICY_REFRESH_CONTINUED = "policy_refresh.continued"
    POLICY_REFRESH_WORKERS_LEFT_OUT = "policy_refresh.workers_left_out"
    POLICY_REFRESH_CANARY_REVIEW = "policy_refresh.canary_review"
    POLICY_REFRESH_CANARY_PASSED = "policy_refresh.canary_passed"
    POLICY_REFRESH_CANARY_FAILED = "policy_refresh.canary_failed"
    # a canary analysis started / concluded, and a breach the watch after a reopen found
    POLICY_REFRESH_ANALYSIS_STARTED = "policy_refresh.analysis_started"
    POLICY_REFRESH_ANALYSIS_DONE = "policy_refresh.analysis_done"
    POLICY_REFRESH_ANALYSIS_BREACH = "policy_refresh.analysis_breach"
    # a trainer's verdict on a canary its strategy leaves to a person (or to no one)
    POLICY_REFRESH_CANARY_VERDICT_REFUSED = "policy_refresh.canary_verdict_refused"
    # canary analysis (controlplane/analysis): a new version of a source's analysis template
    ANALYSIS_TEMPLATE_SAVED = "analysis_template.saved"
    # rollback drills (refresh/drills): a subset to the previous policy and back
    DRILL_STARTED = "drill.started"
    DRILL_SUCCEEDED = "drill.succeeded"
    DRILL_FAILED = "drill.failed"
    DRILL_RESUMED = "drill.resumed"
    DRILL_SKIPPED = "drill.skipped"
    # distributed updates: the collective group and the trainer handshake (refresh/handshake.py)
    POLICY_REFRESH_GROUP_READY = "policy_refresh.group_ready"
    POLICY_REFRESH_BROADCAST_DONE = "policy_refresh.broadcast_done"
    # a broadcast_done for an earlier handshake attempt, or without the one waiting
    POLICY_REFRESH_BROADCAST_REFUSED = "policy_refresh.broadcast_refused"
    # External updates: the workers are paused for the trainer to apply (ready_for_apply), the
    # trainer reported it applied (per worker or for all), or its report was refused.
    POLICY_REFRESH_READY_FOR_APPLY = "policy_refresh.ready_for_apply"
    POLICY_REFRESH_APPLIED = "policy_refresh.applied"
    POLICY_REFRESH_APPLIED_REFUSED = "policy_refresh.applied_refused"
    POLICY_REFRESH_GROUP_DESTROYED = "policy_refresh.group_destroyed"
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
    # operations (controlplane/ops): rows deleted by the retention purge, per kind and batch
    RETENTION_PURGED = "retention.purged"


class ActorType(models.TextChoices):
    USER = "user"
    TOKEN = "token"
    WEBHOOK = "webhook"
    SYSTEM = "system"
