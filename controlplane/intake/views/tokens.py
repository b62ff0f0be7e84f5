"""API token pages: list, create (secret shown once on the result page), revoke."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from controlplane.accounts.access import requires
from controlplane.accounts.models import ApiToken
from controlplane.accounts.roles import Perm
from controlplane.accounts.tokens import create_token, revoke_token
from controlplane.audit.recorder import actor_from_request
from controlplane.intake.forms import TokenForm
from controlplane.intake.views.common import secret_response
from controlplane.requests import HtmxHttpRequest


def _get_token(pk: int) -> ApiToken:
    return get_object_or_404(ApiToken.objects.select_related("user"), pk=pk)


@require_GET
@requires(Perm.MANAGE_TOKENS)
def token_list(request: HtmxHttpRequest) -> HttpResponse:
    tokens = ApiToken.objects.select_related("user").prefetch_related("sources")
    return render(request, "intake/tokens.html", {"tokens": tokens})


@require_http_methods(["GET", "POST"])
@requires(Perm.MANAGE_TOKENS)
def token_create(request: HtmxHttpRequest) -> HttpResponse:
    form = TokenForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            token, secret = create_token(
                user=data["user"],
                label=data["label"],
                actor=actor_from_request(request),
                sources=data["sources"],
                expires_days=data["expires_days"],
            )
        except ValidationError as exc:
            form.add_service_error(exc)
        else:
            # Rendered, not redirected: the secret must never pass through the session.
            context = {"token": token, "secret": secret}
            return secret_response(render(request, "intake/token_created.html", context))
    status = 400 if form.errors else 200
    return render(request, "intake/token_form.html", {"form": form}, status=status)


@require_POST
@requires(Perm.MANAGE_TOKENS)
def token_revoke(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    token = _get_token(pk)
    if token.revoked_at is not None:
        messages.info(request, f"Token {token.label} was already revoked.")
    else:
        revoke_token(token, actor=actor_from_request(request))
        messages.success(request, f"Token {token.label} revoked.")
    return redirect("intake:token_list")
