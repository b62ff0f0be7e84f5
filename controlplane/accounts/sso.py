"""Single sign-on through OpenID Connect (mozilla-django-oidc), roles from the provider's groups.

Why mozilla-django-oidc: it is small, maintained, does the authorization-code flow with state,
nonce and PKCE, checks the ID token's signature against the provider's JWKS, and leaves users
and roles to us. What it leaves out is added here: the issuer and audience of the ID token are
checked (with `azp` when there are several audiences), its times are checked with the provider's
clock skew allowed (`OIDC_CLOCK_SKEW_SECONDS`), a token that fails any check is refused with the
reason rather than answered with an error page, and a userinfo answer for another subject is
refused.

Only the callback authenticates here (`authenticate` takes no password and refuses without the
state, nonce and PKCE verifier the callback view took from the session): a code in the login
form's query string never reaches the provider.

People are found by (issuer, subject) — `SsoIdentity` — never by email or name, so a provider
can never take over a local (break-glass) account that happens to share a name. The role is
decided by the groups claim at every sign-in (`SSO_ROLE_MAP`): a person moved to another group
gets the new role and loses the old one; a person left with no mapped group loses their role
and is refused. Every creation, role change and refusal is audited like a local one.
"""

from __future__ import annotations

import logging

import jwt
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.contrib.auth.validators import UnicodeUsernameValidator
from django.core.exceptions import SuspiciousOperation, ValidationError
from django.db import transaction
from django.utils import timezone
from jwt.exceptions import InvalidSubjectError
from mozilla_django_oidc.auth import OIDCAuthenticationBackend

from controlplane.accounts.models import SsoIdentity
from controlplane.accounts.rolemap import groups_from_claim, role_for_groups
from controlplane.accounts.roles import Role
from controlplane.accounts.services import set_role
from controlplane.accounts.tokens import withdraw_tokens_above
from controlplane.accounts.usernames import confusable_account, normalise
from controlplane.audit.actions import AuditAction
from controlplane.audit.recorder import Actor, record

logger = logging.getLogger(__name__)

#: Who changes roles at sign-in: the mapping in settings, applied by the control plane.
SSO_ACTOR = Actor.system("single sign-on")
VIA = "sso"
#: Set on the request by the callback view (accounts/sso_views.py), the one caller the backend
#: serves: the nonce and PKCE verifier it then passes come from this browser's session, under
#: the state the provider sent back. Without it the backend does nothing.
CALLBACK_VERIFIED = "sso_callback_verified"

#: What a refused ID token is called, by the PyJWT error that refused it.
_TOKEN_REFUSALS: tuple[tuple[type[Exception], str], ...] = (
    (jwt.ExpiredSignatureError, "the provider's ID token has expired"),
    (jwt.ImmatureSignatureError, "the provider's ID token is dated in the future"),
    (jwt.InvalidIssuedAtError, "the provider's ID token has no valid issue time"),
    (InvalidSubjectError, "the provider's ID token names its subject with no string"),
    (jwt.MissingRequiredClaimError, "the provider's ID token lacks a required claim"),
)


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


def _token_refusal(exc: Exception) -> str:
    for kind, reason in _TOKEN_REFUSALS:
        if isinstance(exc, kind):
            return reason
    return "the provider's ID token did not check out"


class SsoBackend(OIDCAuthenticationBackend):
    """Authenticates the OIDC callback only; local passwords stay with ModelBackend."""

    def authenticate(self, request, *, nonce: str | None = None, code_verifier: str | None = None):
        # No **kwargs: Django's authenticate() skips a backend whose signature does not take
        # the credentials it is given, so a username and password never get here. And only the
        # callback view, having matched the state, passes the nonce and PKCE verifier it kept.
        if request is None or not getattr(request, CALLBACK_VERIFIED, False):
            return None
        if not nonce or not code_verifier:
            return None
        return super().authenticate(request, nonce=nonce, code_verifier=code_verifier)

    def _verify_jws(self, payload, key):
        """The signed claims, with times checked against our clock within the allowed skew."""
        alg = jwt.get_unverified_header(payload).get("alg")
        if alg != self.OIDC_RP_SIGN_ALGO:
            raise refuse(self.request, f"the provider signed with {alg!r}, not the configured one")
        return jwt.decode(
            payload,
            key,
            algorithms=[alg],
            leeway=settings.OIDC_CLOCK_SKEW_SECONDS,
            # The audience is checked in verify_token, with azp.
            options={"verify_aud": False, "require": self._required_claims},
        )

    #: An ID token must carry these (OpenID Connect Core 2); a signed userinfo answer only sub.
    _required_claims = ["sub"]

    def verify_token(self, token, **kwargs):
        request = getattr(self, "request", None)
        # mozilla-django-oidc verifies the ID token with its nonce, a signed userinfo answer
        # without one. Backends are made afresh for each authenticate(), so this is per sign-in.
        self._required_claims = ["exp", "iat", "sub"] if "nonce" in kwargs else ["sub"]
        try:
            payload = super().verify_token(token, **kwargs)
        except (jwt.InvalidTokenError, jwt.PyJWKError) as exc:
            # PyJWT's errors are no SuspiciousOperation: without this they become a 500.
            raise refuse(request, _token_refusal(exc)) from exc
        if payload.get("iss") != settings.OIDC_OP_ISSUER:
            raise refuse(request, f"ID token from another issuer ({payload.get('iss')!r})")
        if self.OIDC_RP_CLIENT_ID not in _audience(payload):
            raise refuse(request, "ID token issued to another client")
        # OpenID Connect Core 3.1.3.7: with several audiences the authorized party must be
        # named, and be us; another client's token is not ours to sign in with.
        if isinstance(payload.get("aud"), list) and "azp" not in payload:
            raise refuse(request, "the ID token has a list of audiences and no authorized party")
        if "azp" in payload and payload["azp"] != self.OIDC_RP_CLIENT_ID:
            raise refuse(request, "ID token authorized for another client")
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
        # Tokens carry the role they were minted with: any that could do more than the person
        # may now do go now, not when they expire.
        withdraw_tokens_above(user, role, actor=SSO_ACTOR)
        if role is None:
            raise refuse(
                self.request, "none of your groups is given a role here any more", user=user
            )
        SsoIdentity.objects.filter(pk=identity.pk).update(last_login_at=timezone.now())
        return user

    def _create(self, claims: dict, role: Role):
        User = get_user_model()
        username = normalise(str(claims.get(settings.SSO_USERNAME_CLAIM) or claims["sub"]))[:150]
        try:
            UnicodeUsernameValidator()(username)
        except ValidationError:
            reason = f"the provider's user name {username!r} is not valid here"
            raise refuse(self.request, reason, username=username) from None
        with transaction.atomic():
            existing = confusable_account(username)
            if existing is not None and existing.get_username() == username:
                # Never link by name: that would hand a local account to whoever the provider
                # calls by the same name.
                reason = f"the user name {username!r} is already taken here"
                raise refuse(self.request, reason, username=username)
            if existing is not None:
                # Nor by a name that reads the same (case, Cyrillic or Greek look-alikes).
                reason = f"the user name {username!r} looks like an existing account's"
                raise refuse(self.request, reason, username=username)
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
