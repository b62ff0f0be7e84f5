"""Single sign-on through OpenID Connect (mozilla-django-oidc), roles from the provider's groups.

Why mozilla-django-oidc: it is small, maintained, does the authorization-code flow with state,
nonce and PKCE, checks the ID token's signature against the provider's JWKS, and leaves users
and roles to us. What it leaves out is added here: the issuer and audience of the ID token are
checked, and a userinfo answer for another subject is refused.

People are found by (issuer, subject) — `SsoIdentity` — never by email or name, so a provider
can never take over a local (break-glass) account that happens to share a name. The role is
decided by the groups claim at every sign-in (`SSO_ROLE_MAP`): a person moved to another group
gets the new role and loses the old one; a person left with no mapped group loses their role
and is refused. Every creation, role change and refusal is audited like a local one.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.contrib.auth.validators import UnicodeUsernameValidator
from django.core.exceptions import SuspiciousOperation, ValidationError
from django.db import transaction
from django.utils import timezone
from mozilla_django_oidc.auth import OIDCAuthenticationBackend

from controlplane.accounts.models import SsoIdentity
from controlplane.accounts.rolemap import groups_from_claim, role_for_groups
from controlplane.accounts.roles import Role
from controlplane.accounts.services import set_role
from controlplane.audit.actions import AuditAction
from controlplane.audit.recorder import Actor, record

logger = logging.getLogger(__name__)

#: Who changes roles at sign-in: the mapping in settings, applied by the control plane.
SSO_ACTOR = Actor.system("single sign-on")
VIA = "sso"


class SsoRefused(SuspiciousOperation):
    """The provider vouched for someone we will not let in; the message says why."""


def refuse(request, reason: str, *, user=None, username: str = ""):
    # mozilla-django-oidc swallows SuspiciousOperation from user lookup and only answers None;
    # the callback view reads who and why from the request to audit and show it.
    if request is not None:
        request.sso_refusal = reason
        request.sso_refused_user = user
        request.sso_refused_username = username
    return SsoRefused(reason)


def _audience(payload: dict) -> list[str]:
    aud = payload.get("aud")
    return [aud] if isinstance(aud, str) else [a for a in aud or [] if isinstance(a, str)]


class SsoBackend(OIDCAuthenticationBackend):
    """Authenticates the OIDC callback only; local passwords stay with ModelBackend."""

    def verify_token(self, token, **kwargs):
        payload = super().verify_token(token, **kwargs)
        request = getattr(self, "request", None)
        if payload.get("iss") != settings.OIDC_OP_ISSUER:
            raise refuse(request, f"ID token from another issuer ({payload.get('iss')!r})")
        if self.OIDC_RP_CLIENT_ID not in _audience(payload):
            raise refuse(request, "ID token issued to another client")
        return payload

    def get_or_create_user(self, access_token, id_token, payload):
        userinfo = self.get_userinfo(access_token, id_token, payload)
        if not payload.get("sub") or userinfo.get("sub") != payload.get("sub"):
            raise refuse(self.request, "userinfo answered for another subject")
        # Providers put groups in the ID token, the userinfo answer or both.
        claims = {**payload, **userinfo}
        groups = groups_from_claim(claims.get(settings.SSO_GROUPS_CLAIM))
        role = role_for_groups(groups, settings.SSO_ROLE_MAP)
        identity = (
            SsoIdentity.objects.select_related("user")
            .filter(issuer=settings.OIDC_OP_ISSUER, subject=str(payload["sub"]))
            .first()
        )
        if identity is None:
            if role is None:
                raise refuse(
                    self.request,
                    "none of your groups is given a role here",
                    username=str(claims.get(settings.SSO_USERNAME_CLAIM) or ""),
                )
            return self._create(claims, role)
        user = identity.user
        apply_role(user, role)
        if role is None:
            raise refuse(
                self.request, "none of your groups is given a role here any more", user=user
            )
        SsoIdentity.objects.filter(pk=identity.pk).update(last_login_at=timezone.now())
        return user

    def _create(self, claims: dict, role: Role):
        User = get_user_model()
        username = str(claims.get(settings.SSO_USERNAME_CLAIM) or claims["sub"])[:150]
        try:
            UnicodeUsernameValidator()(username)
        except ValidationError:
            reason = f"the provider's user name {username!r} is not valid here"
            raise refuse(self.request, reason) from None
        with transaction.atomic():
            if User.objects.filter(username=username).exists():
                # Never link by name: that would hand a local account to whoever the provider
                # calls by the same name.
                raise refuse(self.request, f"the user name {username!r} is already taken here")
            user = User(username=username, email=str(claims.get("email") or "")[:254])
            user.set_unusable_password()
            user.save()
            SsoIdentity.objects.create(
                user=user,
                issuer=settings.OIDC_OP_ISSUER,
                subject=str(claims["sub"]),
                last_login_at=timezone.now(),
            )
            user.groups.set([Group.objects.get(name=role.value)])
            record(
                AuditAction.USER_CREATED,
                actor=SSO_ACTOR,
                target=user,
                details={"username": username, "role": role.value, "via": VIA},
            )
        return user


def apply_role(user, role: Role | None) -> bool:
    """Give `user` exactly `role` (None: no role) if that is not already so; audited."""
    current = set(user.groups.values_list("name", flat=True))
    wanted = {role.value} if role else set()
    if current == wanted:
        return False
    set_role(user, role, actor=SSO_ACTOR, via=VIA)
    logger.info("single sign-on: %s now has role %s", user.get_username(), role)
    return True
