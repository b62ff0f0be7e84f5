"""How an action's refusal becomes an exit code: one mapping for every refresh command."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied, ValidationError

from controlplane.accounts.management.commands._cli import Exit, Refused
from controlplane.refresh.errors import RefreshError

#: RefreshError codes that mean "not in this state" or "someone else holds it".
CONFLICT_CODES = frozenset(
    {"invalid_transition", "refresh_conflict", "plan_blocked", "approval_not_allowed"}
)


def refusal(exc: Exception) -> Refused:
    """The Refused for an exception an action function raised (nothing was changed)."""
    if isinstance(exc, RefreshError):
        exit_code = Exit.CONFLICT if exc.code in CONFLICT_CODES else Exit.FAILED
        return Refused(exc.message, exit_code, exc.code)
    if isinstance(exc, PermissionDenied):
        return Refused(str(exc) or "not permitted", Exit.NOT_PERMITTED)
    if isinstance(exc, ValidationError):
        return Refused("; ".join(exc.messages), Exit.USAGE, "invalid_input")
    raise TypeError(f"not a refusal: {exc!r}")


#: What `refusal` accepts, for `except` clauses.
REFUSALS = (RefreshError, PermissionDenied, ValidationError)
