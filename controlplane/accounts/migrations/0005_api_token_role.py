from datetime import timedelta

from django.conf import settings
from django.db import migrations, models
from django.utils import timezone

#: Highest first, frozen here (controlplane.accounts.rolemap.RANK may change).
RANK = ("admin", "approver", "operator", "viewer")


def bound_existing_sso_tokens(apps, schema_editor):
    """Tokens of single sign-on users minted before roles were kept: they get the role their
    user has now and one session's length from now, as a token minted today would; a user with
    no role left has theirs revoked."""
    ApiToken = apps.get_model("accounts", "ApiToken")
    now = timezone.now()
    ceiling = now + timedelta(seconds=settings.SSO_SESSION_SECONDS)
    live = ApiToken.objects.filter(revoked_at__isnull=True, role="", user__sso_identity__isnull=False)
    for token in live.select_related("user"):
        groups = set(token.user.groups.values_list("name", flat=True))
        role = next((r for r in RANK if r in groups), None)
        if role is None:
            token.revoked_at = now
        else:
            token.role = role
            token.expires_at = min(token.expires_at or ceiling, ceiling)
        token.save(update_fields=["role", "expires_at", "revoked_at"])


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0004_sso_identity"),
    ]

    operations = [
        migrations.AddField(
            model_name="apitoken",
            name="role",
            field=models.CharField(
                blank=True,
                choices=[
                    ("viewer", "viewer"),
                    ("operator", "operator"),
                    ("approver", "approver"),
                    ("admin", "admin"),
                ],
                max_length=16,
            ),
        ),
        migrations.RunPython(bound_existing_sso_tokens, migrations.RunPython.noop),
    ]
