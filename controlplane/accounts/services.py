"""Account actions: each writes its change and its audit row in one transaction."""

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.db import transaction

from controlplane.accounts.roles import Role
from controlplane.accounts.usernames import confusable_account, normalise
from controlplane.audit.actions import AuditAction
from controlplane.audit.recorder import Actor, record


def create_user_with_role(
    username: str, role: Role, password: str, *, actor: Actor | None = None, validate: bool = True
):
    """Create a user in exactly one role group. Raises ValidationError on a weak password, or
    on a name that is, or looks like, an existing account's (`accounts/usernames.py`)."""
    User = get_user_model()
    username = normalise(username)
    if validate:
        validate_password(password, User(username=username))
    with transaction.atomic():
        existing = confusable_account(username)
        if existing is not None:
            taken = existing.get_username()
            message = (
                f"user {username!r} already exists"
                if taken == username
                else f"{username!r} looks like the existing account {taken!r}"
            )
            raise ValidationError({"username": message})
        user = User.objects.create_user(username=username, password=password)
        user.groups.set([Group.objects.get(name=role.value)])
        record(
            AuditAction.USER_CREATED,
            actor=actor or Actor.system(),
            target=user,
            details={"username": username, "role": role.value},
        )
    return user


def set_role(user, role: Role | None, *, actor: Actor | None = None, via: str = "") -> None:
    """Put `user` in exactly `role`'s group (no role at all for None), audited.

    `via` names where the decision came from when it was not a person's (e.g. `sso`)."""
    details = {"username": user.get_username(), "role": role.value if role else None}
    if via:
        details["via"] = via
    with transaction.atomic():
        user.groups.set([Group.objects.get(name=role.value)] if role else [])
        record(
            AuditAction.USER_ROLE_CHANGED,
            actor=actor or Actor.system(),
            target=user,
            details=details,
        )
