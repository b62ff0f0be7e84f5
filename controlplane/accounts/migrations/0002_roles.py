"""Create the four role groups and their permissions.

Permissions are created here rather than left to the post-migrate signal, so the groups are
complete as soon as this migration has run (tests and fresh installs rely on that).
"""

from django.db import migrations

PERMISSIONS = {
    "view_controlplane": "Can view fleets, policy refreshes and history",
    "run_discovery": "Can run discovery refreshes",
    "operate_policy_refresh": "Can plan, start, abort and retry policy refreshes",
    "approve_policy_refresh": "Can approve or reject policy refreshes",
    "force_reopen_gate": "Can force-reopen a held gate",
    "manage_sources": "Can create, edit and remove sources",
    "manage_tokens": "Can create and revoke API tokens",
    "manage_webhooks": "Can manage trainer webhooks and notification destinations",
    "manage_users": "Can manage users and their roles",
}

ROLES = {
    "viewer": ["view_controlplane"],
    "operator": ["view_controlplane", "run_discovery", "operate_policy_refresh"],
    "approver": ["view_controlplane", "approve_policy_refresh", "force_reopen_gate"],
    "admin": list(PERMISSIONS),
}


def create_roles(apps, schema_editor):
    ContentType = apps.get_model("contenttypes", "ContentType")
    Permission = apps.get_model("auth", "Permission")
    Group = apps.get_model("auth", "Group")
    content_type, _ = ContentType.objects.get_or_create(app_label="accounts", model="capability")
    permissions = {}
    for codename, name in PERMISSIONS.items():
        permissions[codename], _ = Permission.objects.get_or_create(
            content_type=content_type, codename=codename, defaults={"name": name}
        )
    for role, codenames in ROLES.items():
        group, _ = Group.objects.get_or_create(name=role)
        group.permissions.set([permissions[c] for c in codenames])


def remove_roles(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name__in=ROLES).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0001_initial"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [migrations.RunPython(create_roles, remove_roles)]
