"""Errors a caller shows to a person. Each has a stable `code` and a one-line `message`."""


class RefreshError(Exception):
    code = "refresh_error"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return self.message


class PlanBlocked(RefreshError):
    """The stored plan has blockers; nothing may start until they are fixed and re-planned."""

    code = "plan_blocked"


class RefreshConflict(RefreshError):
    """Another refresh is active on the scope. `active_refresh_id` names it."""

    code = "refresh_conflict"

    def __init__(self, message: str, *, active_refresh_id: int | None = None) -> None:
        super().__init__(message)
        self.active_refresh_id = active_refresh_id


class InvalidTransition(RefreshError):
    """The action does not apply to the refresh in its current state."""

    code = "invalid_transition"


class ApprovalNotAllowed(RefreshError):
    """The approver is the requester, or the refresh does not wait for approval."""

    code = "approval_not_allowed"


def state_refusal(subject: str, state: str, *, wanted: str = "", why: str = "") -> str:
    """The one wording of an action refused for the state of `subject` (`policy refresh #7`,
    `quarantine #3`): naming the state it wants (`... is running, not held`) or saying why
    (`... is running; only an active refresh ends`)."""
    said = f"{subject} is {state}"
    return f"{said}; {why}" if why else f"{said}, not {wanted}"


def wrong_state(refresh, *, wanted: str = "", why: str = "") -> InvalidTransition:
    """An action refused for the refresh's state, worded by `state_refusal`."""
    return InvalidTransition(
        state_refusal(f"policy refresh #{refresh.pk}", refresh.state, wanted=wanted, why=why)
    )
