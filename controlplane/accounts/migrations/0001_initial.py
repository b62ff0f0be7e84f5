from django.db import migrations


class Migration(migrations.Migration):
    initial = True

    dependencies = []

    operations = [
        migrations.CreateModel(
            name="Capability",
            fields=[],
            options={
                "managed": False,
                "default_permissions": (),
                "permissions": [
                    ("view_controlplane", "Can view fleets, policy refreshes and history"),
                    ("run_discovery", "Can run discovery refreshes"),
                    ("operate_policy_refresh", "Can plan, start, abort and retry policy refreshes"),
                    ("approve_policy_refresh", "Can approve or reject policy refreshes"),
                    ("force_reopen_gate", "Can force-reopen a held gate"),
                    ("manage_sources", "Can create, edit and remove sources"),
                    ("manage_tokens", "Can create and revoke API tokens"),
                    (
                        "manage_webhooks",
                        "Can manage trainer webhooks and notification destinations",
                    ),
                    ("manage_users", "Can manage users and their roles"),
                ],
            },
        ),
    ]
