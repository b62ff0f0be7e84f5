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
from controlplane.intake.views.common import shown_once, stash_secret, take_secret
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
            # Redirected, so a reload cannot create a second token; the secret is split
            # between the session and a cookie until that one page shows it (common.py).
            response = redirect("intake:token_created", pk=token.pk)
            return stash_secret(request, response, kind="token", pk=token.pk, secret=secret)
    status = 400 if form.errors else 200
    return render(request, "intake/token_form.html", {"form": form}, status=status)


@require_GET
@requires(Perm.MANAGE_TOKENS)
def token_created(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """The new token's secret, shown once; a reload finds it gone and says so."""
    token = _get_token(pk)
    taken = take_secret(request, kind="token", pk=token.pk)
    if taken is None:
        messages.info(
            request,
            f"The secret of token {token.label} was shown once and is not shown again; "
            "create a new token if it was not copied.",
        )
        return redirect("intake:token_list")
    context = {"token": token, "secret": taken[0]}
    return shown_once(render(request, "intake/token_created.html", context))


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
