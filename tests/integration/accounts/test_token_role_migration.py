"""Upgrading bounds the tokens single sign-on users already have, as if minted today."""

from datetime import timedelta

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from controlplane.accounts.models import ApiToken

BEFORE_ROLES = ("accounts", "0004_sso_identity")


def _old_rows(apps) -> None:
    User, Group = apps.get_model("auth", "User"), apps.get_model("auth", "Group")
    SsoIdentity, ApiToken = (
        apps.get_model("accounts", "SsoIdentity"),
        apps.get_model("accounts", "ApiToken"),
    )
    far = timezone.now() + timedelta(days=90)
    for name, group, expires_at in [
        ("sso-admin", "admin", None),
        ("sso-gone", None, far),
        ("local-ops", "operator", None),
    ]:
        user = User.objects.create(username=name)
        if group:
            user.groups.add(Group.objects.get_or_create(name=group)[0])
        if name.startswith("sso-"):
            SsoIdentity.objects.create(user=user, issuer="https://idp.test", subject=name)
        ApiToken.objects.create(
            label=name, user=user, key_id=name[:12], secret_hash="0" * 64, expires_at=expires_at
        )


@pytest.mark.django_db(transaction=True)
def test_existing_sso_tokens_get_their_users_role_and_a_session_length(settings):
    settings.SSO_SESSION_SECONDS = 3600
    executor = MigrationExecutor(connection)
    latest = executor.loader.graph.leaf_nodes("accounts")
    executor.migrate([BEFORE_ROLES])
    try:
        _old_rows(executor.loader.project_state([BEFORE_ROLES]).apps)
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(latest)
    upgraded = timezone.now()

    tokens = {t.label: t for t in ApiToken.objects.all()}
    admin = tokens["sso-admin"]
    assert admin.role == "admin" and admin.revoked_at is None
    assert upgraded - timedelta(minutes=5) < admin.expires_at <= upgraded + timedelta(hours=1)
    assert tokens["sso-gone"].revoked_at is not None  # no role left: nothing to give it
    local = tokens["local-ops"]
    assert local.role == "" and local.expires_at is None and local.revoked_at is None
