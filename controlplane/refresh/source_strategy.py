"""A source's default refresh strategy: what a plan gets when it names none (the plan form's
blank choice, an API plan without `strategy`, a webhook whose endpoint has no default).

It lives here, not with the source's other settings in `fleet`, because only the refresh app
knows what a valid strategy is; the change is audited as a source update all the same.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.db import transaction

from controlplane.accounts.roles import Perm
from controlplane.audit.actions import AuditAction
from controlplane.audit.recorder import Actor, record
from controlplane.fleet.models import Source
from controlplane.refresh.strategy import DEFAULT, parse_strategy


def set_default_strategy(source: Source, strategy: Any, *, actor: Actor) -> Source:
    """Validate (ValidationError naming the field) and store a source's default strategy.
    All at once is stored as `{}`, the form every source starts with."""
    if actor.user is not None and not actor.user.has_perm(Perm.MANAGE_SOURCES.value):
        raise PermissionDenied(f"{actor.label} may not change a source's default strategy")
    parsed = parse_strategy(strategy or None)
    value = {} if parsed == DEFAULT else parsed.to_dict()
    with transaction.atomic():
        locked = Source.objects.select_for_update(no_key=True).get(pk=source.pk)
        before = dict(locked.default_strategy or {})
        if before == value:
            return locked
        locked.default_strategy = value
        locked.save(update_fields=["default_strategy", "updated_at"])
        record(
            AuditAction.SOURCE_UPDATED,
            actor=actor,
            target=locked,
            details={
                "changed": {"default_strategy": [before, value]},
                "default_strategy": parsed.describe(),
            },
        )
    return locked
