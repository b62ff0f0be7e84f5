"""Remembered `Idempotency-Key`s of API calls that start work."""

from django.conf import settings
from django.db import models

from controlplane.textlimits import REQUEST_PATH_CHARS


class IdempotencyState(models.TextChoices):
    IN_FLIGHT = "in_flight"
    DONE = "done"


class IdempotencyRecord(models.Model):
    """One key used by one principal on one operation, with the response it produced.

    The unique constraint is what settles a race: two concurrent first uses both try to insert,
    one wins and runs, the other gets an IntegrityError and answers 409. Scoping by principal
    keeps one caller's keys from colliding with (or revealing) another's.
    """

    principal = models.CharField(max_length=200)
    key = models.CharField(max_length=200)
    operation = models.CharField(max_length=REQUEST_PATH_CHARS)
    request_hash = models.CharField(max_length=64)
    state = models.CharField(
        max_length=16, choices=IdempotencyState.choices, default=IdempotencyState.IN_FLIGHT
    )
    status_code = models.PositiveIntegerField(null=True, blank=True)
    #: Shape: `OpaqueJson` (controlplane/jsontypes.py): the answer replayed as given.
    response_body = models.JSONField(null=True, blank=True)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["principal", "key"], name="idempotency_unique_key")
        ]

    def __str__(self) -> str:
        return f"{self.principal} {self.key}"
