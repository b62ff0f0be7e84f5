from django.conf import settings
from django.db import models
from django.utils import timezone

from controlplane.accounts.roles import Role


class Capability(models.Model):
    """Anchor for the control plane's permissions; it has no table and holds no rows.

    Permissions describe what a person may do to the fleet as a whole (run discovery, start a
    policy refresh, approve one), which no single model owns, so they hang off this anchor.
    """

    class Meta:
        managed = False
        default_permissions = ()
        permissions = [
            ("view_controlplane", "Can view fleets, policy refreshes and history"),
            ("run_discovery", "Can run discovery refreshes"),
            ("operate_policy_refresh", "Can plan, start, abort and retry policy refreshes"),
            ("approve_policy_refresh", "Can approve or reject policy refreshes"),
            ("force_reopen_gate", "Can force-reopen a held gate"),
            ("manage_sources", "Can create, edit and remove sources"),
            ("manage_tokens", "Can create and revoke API tokens"),
            ("manage_webhooks", "Can manage trainer webhooks and notification destinations"),
            ("manage_users", "Can manage users and their roles"),
        ]

    def __str__(self) -> str:
        return "capability anchor"


class ApiToken(models.Model):
    """A bearer token for the JSON API, acting as its user (and so with the user's role).

    Only a SHA-256 of the secret is stored; the secret is shown once at creation. The secret
    is 256 random bits, so a plain hash is enough (no slow KDF needed: nothing to brute-force).
    `key_id` is the public part of the secret used to find the row before comparing hashes.
    An empty `sources` set means every source; otherwise objects of other sources are invisible.

    A token acting as a single sign-on user carries `role`, their role when it was minted: it
    never does more than that role allows (nor more than the user may do now), and it expires
    within `SSO_SESSION_SECONDS` of minting, as their session does, so a role taken away at the
    provider outlives its removal no longer through a token than through a browser.
    """

    label = models.SlugField(max_length=64, unique=True)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    key_id = models.CharField(max_length=16, unique=True)
    secret_hash = models.CharField(max_length=64)
    sources = models.ManyToManyField("fleet.Source", blank=True, related_name="api_tokens")
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.CharField(max_length=200, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    #: Empty for a local user's token, which acts with its user's role of the moment.
    role = models.CharField(max_length=16, blank=True, choices=[(r.value, r.value) for r in Role])

    class Meta:
        ordering = ["label"]

    def __str__(self) -> str:
        return self.label

    @property
    def status(self) -> str:
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= timezone.now():
            return "expired"
        return "active"


class SsoIdentity(models.Model):
    """Links a user to one person at the OpenID provider: (issuer, subject) never changes for
    them, unlike their name or email, so sign-ins find the same user by it.

    A user with an identity was created by single sign-on and has no usable password; a local
    account (break-glass) has none and is never taken over by a provider's claims.
    """

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="sso_identity"
    )
    issuer = models.CharField(max_length=300)
    subject = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)
    last_login_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["issuer", "subject"], name="sso_identity_unique")
        ]

    def __str__(self) -> str:
        return f"{self.subject} at {self.issuer}"
