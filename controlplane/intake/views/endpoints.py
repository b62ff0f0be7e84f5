"""Webhook endpoint pages: list, create, edit, remove, secret rotation, test event, and the
last webhooks each endpoint received."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.db.models import Count, Max
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from controlplane.accounts.access import requires
from controlplane.accounts.roles import Perm
from controlplane.audit.recorder import actor_from_request
from controlplane.intake import services
from controlplane.intake.forms import WebhookEndpointForm
from controlplane.intake.models import WebhookEndpoint
from controlplane.intake.views.common import shown_once, stash_secret, take_secret
from controlplane.notify.emit import absolute_url
from controlplane.refresh.strategy import parse_strategy
from controlplane.requests import HtmxHttpRequest

RECEIVED_SHOWN = 20


def _get_endpoint(pk: int) -> WebhookEndpoint:
    return get_object_or_404(WebhookEndpoint.objects.select_related("source"), pk=pk)


def trainer_url(endpoint: WebhookEndpoint) -> str:
    return absolute_url(reverse("intake:api-v1:trainer_webhook", args=[endpoint.name]))


@require_GET
@requires(Perm.MANAGE_WEBHOOKS)
def endpoint_list(request: HtmxHttpRequest) -> HttpResponse:
    endpoints = WebhookEndpoint.objects.select_related("source").annotate(
        received_count=Count("received"), last_received_at=Max("received__received_at")
    )
    return render(request, "intake/endpoints.html", {"endpoints": endpoints})


def endpoint_strategy_text(endpoint: WebhookEndpoint) -> str:
    if endpoint.default_strategy:
        return parse_strategy(endpoint.default_strategy).describe()
    source_default = parse_strategy(endpoint.source.default_strategy or None).describe()
    return f"the source's default ({source_default})"


def _detail_context(endpoint: WebhookEndpoint, **extra) -> dict:
    return {
        "endpoint": endpoint,
        "trainer_url": trainer_url(endpoint),
        "fingerprints": [services.secret_fingerprint(s) for s in endpoint.secrets],
        "max_secrets": services.MAX_SECRETS,
        "strategy": endpoint_strategy_text(endpoint),
        "received": endpoint.received.all()[:RECEIVED_SHOWN],
        **extra,
    }


@require_GET
@requires(Perm.MANAGE_WEBHOOKS)
def endpoint_detail(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    endpoint = _get_endpoint(pk)
    template = "intake/endpoint.html#received" if request.htmx else "intake/endpoint.html"
    return render(request, template, _detail_context(endpoint))


@require_http_methods(["GET", "POST"])
@requires(Perm.MANAGE_WEBHOOKS)
def endpoint_create(request: HtmxHttpRequest) -> HttpResponse:
    form = WebhookEndpointForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            endpoint, secret = services.create_webhook_endpoint(
                actor=actor_from_request(request), **form.cleaned_data
            )
        except ValidationError as exc:
            form.add_service_error(exc)
        else:
            response = redirect("intake:endpoint_secret_shown", pk=endpoint.pk)
            return stash_secret(
                request, response, kind="endpoint", pk=endpoint.pk, secret=secret, created=True
            )
    status = 400 if form.errors else 200
    return render(request, "intake/endpoint_form.html", {"form": form}, status=status)


@require_http_methods(["GET", "POST"])
@requires(Perm.MANAGE_WEBHOOKS)
def endpoint_edit(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    endpoint = _get_endpoint(pk)
    form = WebhookEndpointForm.for_endpoint(endpoint, request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            services.update_webhook_endpoint(
                endpoint, actor=actor_from_request(request), **form.cleaned_data
            )
        except ValidationError as exc:
            form.add_service_error(exc)
        else:
            messages.success(request, f"Webhook endpoint {endpoint.name} saved.")
            return redirect("intake:endpoint", pk=endpoint.pk)
    status = 400 if form.errors else 200
    context = {"form": form, "endpoint": endpoint}
    return render(request, "intake/endpoint_form.html", context, status=status)


@require_http_methods(["GET", "POST"])
@requires(Perm.MANAGE_WEBHOOKS)
def endpoint_delete(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    endpoint = _get_endpoint(pk)
    if request.method == "POST":
        services.remove_webhook_endpoint(endpoint, actor=actor_from_request(request))
        messages.success(request, f"Webhook endpoint {endpoint.name} removed.")
        return redirect("intake:endpoint_list")
    return render(request, "intake/endpoint_delete.html", {"endpoint": endpoint})


@require_POST
@requires(Perm.MANAGE_WEBHOOKS)
def endpoint_rotate(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    endpoint = _get_endpoint(pk)
    try:
        secret = services.add_webhook_secret(endpoint, actor=actor_from_request(request))
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
        return redirect("intake:endpoint", pk=endpoint.pk)
    response = redirect("intake:endpoint_secret_shown", pk=endpoint.pk)
    return stash_secret(request, response, kind="endpoint", pk=endpoint.pk, secret=secret)


@require_GET
@requires(Perm.MANAGE_WEBHOOKS)
def endpoint_secret_shown(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """A new signing secret (of a created endpoint, or added by a rotation), shown once."""
    endpoint = _get_endpoint(pk)
    taken = take_secret(request, kind="endpoint", pk=endpoint.pk)
    if taken is None:
        messages.info(
            request,
            f"The new signing secret of {endpoint.name} was shown once and is not shown again; "
            "add another secret if it was not copied.",
        )
        return redirect("intake:endpoint", pk=endpoint.pk)
    secret, extra = taken
    context = {
        "endpoint": endpoint,
        "secret": secret,
        "trainer_url": trainer_url(endpoint),
        "created": bool(extra.get("created")),
    }
    return shown_once(render(request, "intake/endpoint_secret.html", context))


@require_POST
@requires(Perm.MANAGE_WEBHOOKS)
def endpoint_remove_secret(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    endpoint = _get_endpoint(pk)
    fingerprint = request.POST.get("fingerprint", "")
    try:
        services.remove_webhook_secret(
            endpoint, actor=actor_from_request(request), fingerprint=fingerprint
        )
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        messages.success(request, f"Secret {fingerprint} removed from {endpoint.name}.")
    return redirect("intake:endpoint", pk=endpoint.pk)


@require_POST
@requires(Perm.MANAGE_WEBHOOKS)
def endpoint_test(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """Send a signed `test.ping` through the real receive path (audited there as
    `webhook.accepted`, or `webhook.rejected` with the reason, and as
    `webhook_endpoint.test_sent` naming who pressed the button)."""
    endpoint = _get_endpoint(pk)
    answer = services.send_test_webhook_event(endpoint, actor=actor_from_request(request))
    ok = answer.status < 300
    if request.htmx:
        context = _detail_context(endpoint, answer=answer, ok=ok, oob=True)
        return render(request, "intake/endpoint.html#test_result", context)
    if ok:
        messages.success(request, "Test event received and verified.")
    else:
        error = answer.body.get("error", {})
        messages.error(request, f"Test event refused ({answer.status}): {error.get('message')}")
    return redirect("intake:endpoint", pk=endpoint.pk)
