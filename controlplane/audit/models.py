from django.conf import settings
from django.db import models

from controlplane.audit.actions import ActorType
from controlplane.textlimits import LABEL_CHARS, QUOTED_CHARS


class AuditEventQuerySet(models.QuerySet):
    def update(self, **kwargs):
        raise TypeError("audit events are append-only")

    def delete(self):
        raise TypeError("audit events are append-only")


class AuditEvent(models.Model):
    """One audited action: who did what to which object, when, and why.

    Rows are append-only and hash-chained: `entry_hash` is an HMAC, under a key held outside
    the database, of this row's canonical content and the previous row's hash, so changing,
    deleting or reordering any row breaks the chain from that row on (`manage.py audit
    verify`). `sequence` is gap-free, which is what reveals a deleted row in the middle; signed
    checkpoints kept outside the database reveal deleted rows at the end (controlplane/audit/
    anchors.py).
    """

    sequence = models.PositiveBigIntegerField(unique=True)
    occurred_at = models.DateTimeField(db_index=True)
    actor_type = models.CharField(max_length=16, choices=ActorType.choices)
    # No database constraint: the audit trail must outlive the user row it mentions.
    actor_user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="+",
    )
    actor_label = models.CharField(max_length=LABEL_CHARS, db_index=True)
    source_ip = models.GenericIPAddressField(null=True, blank=True)
    # Names come from AuditAction; no `choices` here so adding an action needs no migration.
    action = models.CharField(max_length=64, db_index=True)
    target_type = models.CharField(max_length=64, blank=True)
    target_id = models.CharField(max_length=200, blank=True)
    target_label = models.CharField(max_length=QUOTED_CHARS, blank=True)
    #: Shape: `OpaqueJson` (controlplane/jsontypes.py): each action records its own details, hashed
    #: as written.
    details = models.JSONField(default=dict)
    correlation_id = models.CharField(max_length=64, blank=True, db_index=True)
    previous_hash = models.CharField(max_length=64)
    entry_hash = models.CharField(max_length=64)
    # Which key signed `entry_hash` (an HMAC-SHA256). Blank on rows written before keying,
    # whose hash is a plain SHA-256; they verify as legacy rows and can only form a prefix.
    key_id = models.CharField(max_length=32, blank=True, default="")

    objects = AuditEventQuerySet.as_manager()

    class Meta:
        ordering = ["-sequence"]
        indexes = [
            models.Index(fields=["target_type", "target_id"], name="audit_target_idx"),
            models.Index(fields=["action", "-sequence"], name="audit_action_seq_idx"),
        ]

    def __str__(self) -> str:
        return f"#{self.sequence} {self.action} by {self.actor_label}"

    def save(self, *args, **kwargs):
        if self.pk is not None:
            raise TypeError("audit events are append-only")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise TypeError("audit events are append-only")

    @property
    def target_display(self) -> str:
        return self.target_label or (f"{self.target_type} {self.target_id}".strip())


class AuditChainHead(models.Model):
    """The single row that serialises appends and remembers the newest hash.

    Every append first bumps this row with an UPDATE, which takes a row lock on PostgreSQL and
    the write lock on SQLite, so concurrent writers extend the chain one at a time.
    """

    last_sequence = models.PositiveBigIntegerField(default=0)
    last_hash = models.CharField(max_length=64, default="0" * 64)

    def __str__(self) -> str:
        return f"audit head #{self.last_sequence}"
