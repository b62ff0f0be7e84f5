"""The four roles and what each may do.

Roles are Django groups; what they grant are permissions on the `accounts.Capability` anchor.
Views and consumers check the permission (`accounts.<codename>`), never the group name, so a
site can compose its own roles from the same permissions.
"""

from enum import StrEnum


class Role(StrEnum):
    VIEWER = "viewer"
    OPERATOR = "operator"
    APPROVER = "approver"
    ADMIN = "admin"


class Perm(StrEnum):
    """Full permission names as `user.has_perm` expects them."""

    VIEW = "accounts.view_controlplane"
    RUN_DISCOVERY = "accounts.run_discovery"
    OPERATE_REFRESH = "accounts.operate_policy_refresh"
    APPROVE_REFRESH = "accounts.approve_policy_refresh"
    FORCE_REOPEN = "accounts.force_reopen_gate"
    MANAGE_SOURCES = "accounts.manage_sources"
    MANAGE_TOKENS = "accounts.manage_tokens"
    MANAGE_WEBHOOKS = "accounts.manage_webhooks"
    MANAGE_USERS = "accounts.manage_users"

    @property
    def codename(self) -> str:
        return self.value.split(".", 1)[1]


# Codename and human description; the data migration keeps its own frozen copy.
PERMISSION_DESCRIPTIONS: dict[Perm, str] = {
    Perm.VIEW: "Can view fleets, policy refreshes and history",
    Perm.RUN_DISCOVERY: "Can run discovery refreshes",
    Perm.OPERATE_REFRESH: "Can plan, start, abort and retry policy refreshes",
    Perm.APPROVE_REFRESH: "Can approve or reject policy refreshes",
    Perm.FORCE_REOPEN: "Can force-reopen a held gate",
    Perm.MANAGE_SOURCES: "Can create, edit and remove sources",
    Perm.MANAGE_TOKENS: "Can create and revoke API tokens",
    Perm.MANAGE_WEBHOOKS: "Can manage trainer webhooks and notification destinations",
    Perm.MANAGE_USERS: "Can manage users and their roles",
}

ROLE_PERMISSIONS: dict[Role, frozenset[Perm]] = {
    Role.VIEWER: frozenset({Perm.VIEW}),
    Role.OPERATOR: frozenset({Perm.VIEW, Perm.RUN_DISCOVERY, Perm.OPERATE_REFRESH}),
    Role.APPROVER: frozenset({Perm.VIEW, Perm.APPROVE_REFRESH, Perm.FORCE_REOPEN}),
    Role.ADMIN: frozenset(Perm),
}


def role_of(user) -> Role | None:
    """The highest role a user holds, for display. Superusers count as admin."""
    if not getattr(user, "is_authenticated", False):
        return None
    if user.is_superuser:
        return Role.ADMIN
    names = set(user.groups.values_list("name", flat=True))
    for role in (Role.ADMIN, Role.APPROVER, Role.OPERATOR, Role.VIEWER):
        if role.value in names:
            return role
    return None


def sync_roles(**_kwargs) -> None:
    """Make the four role groups exist with exactly their permissions. Idempotent.

    The 0002 migration creates them on install; this also runs after every migrate/flush
    (post_migrate), because a flush — as tests between transactional cases do — empties the
    groups table while the permissions come back from their model's Meta.
    """
    # Imported here because this module is loaded with the app config, before models are.
    from django.contrib.auth.models import Group, Permission
    from django.contrib.contenttypes.models import ContentType

    content_type, _ = ContentType.objects.get_or_create(app_label="accounts", model="capability")
    permissions = {}
    for perm, description in PERMISSION_DESCRIPTIONS.items():
        permissions[perm], _ = Permission.objects.get_or_create(
            content_type=content_type, codename=perm.codename, defaults={"name": description}
        )
    for role, granted in ROLE_PERMISSIONS.items():
        group, _ = Group.objects.get_or_create(name=role.value)
        group.permissions.set([permissions[p] for p in granted])
