from django.conf import settings
from django.contrib import auth
from django.contrib.auth.decorators import login_not_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render, resolve_url
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_protect
from django.views.decorators.debug import sensitive_post_parameters
from django.views.decorators.http import require_http_methods, require_POST

from controlplane.accounts import throttle
from controlplane.accounts.forms import LocalLoginForm
from controlplane.accounts.sso_views import SSO_ERROR_KEY
from controlplane.audit.actions import ActorType, AuditAction
from controlplane.audit.recorder import Actor, client_ip, record


def _next_url(request: HttpRequest) -> str:
    candidate = request.POST.get("next") or request.GET.get("next") or ""
    if url_has_allowed_host_and_scheme(
        candidate, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return candidate
    return resolve_url(settings.LOGIN_REDIRECT_URL)


@login_not_required
@sensitive_post_parameters("password")
@csrf_protect
@never_cache
@require_http_methods(["GET", "POST"])
def login(request: HttpRequest) -> HttpResponse:
    if request.user.is_authenticated and request.method == "GET":
        return redirect(_next_url(request))
    form = LocalLoginForm(request, data=request.POST or None)
    status = 200
    # A refused single sign-on comes back here with its reason (accounts/sso_views.py).
    error = request.session.pop(SSO_ERROR_KEY, None) if request.method == "GET" else None
    if request.method == "POST" and not settings.LOCAL_LOGIN_ENABLED:
        username = request.POST.get("username", "")[:150]
        form = LocalLoginForm(request)
        error = "Sign-in with a local account is turned off here."
        record(
            AuditAction.LOGIN_FAILED,
            actor=Actor(ActorType.USER, username or "anonymous"),
            request=request,
            details={"username": username, "reason": "local sign-in is turned off"},
        )
        status = 403
    elif request.method == "POST":
        username = request.POST.get("username", "")[:150]
        ip = client_ip(request)
        if throttle.is_throttled(username, ip):
            form = LocalLoginForm(request)
            error = "Too many failed sign-in attempts. Wait a few minutes and try again."
            record(
                AuditAction.LOGIN_THROTTLED,
                actor=Actor(ActorType.USER, username or "anonymous"),
                request=request,
                details={"username": username},
            )
            status = 429
        elif form.is_valid():
            user = form.get_user()
            auth.login(request, user)
            throttle.clear(username, ip)
            record(AuditAction.LOGIN_SUCCEEDED, actor=Actor.for_user(user), request=request)
            return redirect(_next_url(request))
        else:
            throttle.note_failure(username, ip)
            record(
                AuditAction.LOGIN_FAILED,
                actor=Actor(ActorType.USER, username or "anonymous"),
                request=request,
                details={"username": username},
            )
            status = 401
    context = {
        "form": form,
        "error": error,
        "next": _next_url(request) if request.GET.get("next") else "",
        "local_login": settings.LOCAL_LOGIN_ENABLED,
        "sso_provider_name": settings.SSO_PROVIDER_NAME if settings.SSO_ENABLED else None,
    }
    return render(request, "accounts/login.html", context, status=status)


@require_POST
def logout(request: HttpRequest) -> HttpResponse:
    user = request.user
    record(AuditAction.LOGGED_OUT, actor=Actor.for_user(user), request=request)
    auth.logout(request)
    return redirect(settings.LOGOUT_REDIRECT_URL)
