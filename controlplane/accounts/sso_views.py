"""The two single sign-on endpoints: start the authorization-code flow, and its callback.

Both are mozilla-django-oidc's views, answering 404 while single sign-on is off, with the
callback audited like the login form: `auth.login_succeeded` / `auth.login_failed` with
`"via": "sso"` and, on failure, the reason (shown on the login page too).
"""

from __future__ import annotations

import logging

import requests
from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.core.exceptions import SuspiciousOperation
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import resolve_url
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from controlplane.accounts.sso import CALLBACK_VERIFIED
from controlplane.audit.actions import ActorType, AuditAction
from controlplane.audit.recorder import Actor, record

logger = logging.getLogger(__name__)

SSO_ERROR_KEY = "sso_error"
VIA = "sso"


class _Callback(OIDCAuthenticationCallbackView):
    def login_success(self) -> HttpResponse:
        response = super().login_success()
        # Bounded, so a role taken away at the provider goes at the latest with the session.
        self.request.session.set_expiry(settings.SSO_SESSION_SECONDS)
        record(
            AuditAction.LOGIN_SUCCEEDED,
            actor=Actor.for_user(self.user),
            request=self.request,
            details={"via": VIA},
        )
        return response

    def login_failure(self) -> HttpResponse:
        request = self.request
        user = getattr(self, "user", None) or getattr(request, "sso_refused_user", None)
        reason = getattr(request, "sso_refusal", "")
        if not reason and user is not None and not user.is_active:
            reason = "this account is disabled"
        if not reason and request.GET.get("error"):
            # The provider's own words (e.g. access_denied): data, shown escaped, cut short.
            reason = f"the provider answered {request.GET['error'][:100]}"
        reason = reason or "sign-in was not completed"
        if user is not None:
            actor = Actor.for_user(user)
        else:
            actor = Actor(
                ActorType.USER, getattr(request, "sso_refused_username", "") or "anonymous"
            )
        record(
            AuditAction.LOGIN_FAILED,
            actor=actor,
            request=request,
            details={"via": VIA, "reason": reason},
        )
        request.session[SSO_ERROR_KEY] = f"Single sign-on did not let you in: {reason}."
        return HttpResponseRedirect(resolve_url(settings.LOGIN_URL))

    def get(self, request):
        # The backend authenticates only for this view, which passes it the nonce and PKCE
        # verifier kept in the session under the state the provider sent back.
        setattr(request, CALLBACK_VERIFIED, True)
        try:
            return super().get(request)
        except (SuspiciousOperation, requests.RequestException, ValueError) as exc:
            # A replayed or forged callback, an unreachable or failing provider, a bad token.
            logger.warning("single sign-on callback failed: %s", exc)
            if not getattr(request, "sso_refusal", ""):
                request.sso_refusal = (
                    "the provider could not be reached"
                    if isinstance(exc, requests.RequestException)
                    else "the provider's answer did not check out"
                )
            return self.login_failure()


def _enabled() -> None:
    if not settings.SSO_ENABLED:
        raise Http404("single sign-on is not configured")


@login_not_required
@never_cache
@require_GET
def sso_login(request: HttpRequest) -> HttpResponse:
    _enabled()
    return OIDCAuthenticationRequestView.as_view()(request)


@login_not_required
@never_cache
@require_GET
def sso_callback(request: HttpRequest) -> HttpResponse:
    _enabled()
    return _Callback.as_view()(request)
