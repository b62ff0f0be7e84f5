"""Notification destination pages: list, create, edit, remove, new signing secret, test send,
and the delivery log with every attempt."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.db.models import Prefetch
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from controlplane.accounts.access import requires
from controlplane.accounts.roles import Perm
from controlplane.audit.recorder import actor_from_request
from controlplane.intake.forms import DestinationForm
from controlplane.intake.views.common import shown_once, stash_secret, take_secret
from controlplane.notify import services
from controlplane.notify.models import (
    DeliveryStatus,
    NotificationAttempt,
    NotificationDelivery,
    NotificationDestination,
)
from controlplane.requests import HtmxHttpRequest

DELIVERIES_SHOWN = 50
UNFINISHED = (DeliveryStatus.PENDING, DeliveryStatus.RETRYING)


def _get_destination(pk: int) -> NotificationDestination:
    return get_object_or_404(NotificationDestination.objects.select_related("source"), pk=pk)


@require_GET
@requires(Perm.MANAGE_WEBHOOKS)
def destination_list(request: HtmxHttpRequest) -> HttpResponse:
    destinations = NotificationDestination.objects.select_related("source")
    return render(request, "intake/destinations.html", {"destinations": destinations})


@require_GET
@requires(Perm.MANAGE_WEBHOOKS)
def destination_detail(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    destination = _get_destination(pk)
    deliveries = list(
        NotificationDelivery.objects.filter(destination=destination).prefetch_related(
            Prefetch("attempt_log", queryset=NotificationAttempt.objects.order_by("number"))
        )[:DELIVERIES_SHOWN]
    )
    context = {
        "destination": destination,
        "deliveries": deliveries,
        # The log polls only while something is still in flight.
        "polling": any(d.status in UNFINISHED for d in deliveries),
    }
    template = "intake/destination.html#deliveries" if request.htmx else "intake/destination.html"
    return render(request, template, context)


@require_http_methods(["GET", "POST"])
@requires(Perm.MANAGE_WEBHOOKS)
def destination_create(request: HtmxHttpRequest) -> HttpResponse:
    form = DestinationForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            destination, secret = services.create_notification_destination(
                actor=actor_from_request(request), **form.cleaned_data
            )
        except ValidationError as exc:
            form.add_service_error(exc)
        else:
            response = redirect("intake:destination_secret_shown", pk=destination.pk)
            return stash_secret(
                request,
                response,
                kind="destination",
                pk=destination.pk,
                secret=secret,
                created=True,
            )
    status = 400 if form.errors else 200
    return render(request, "intake/destination_form.html", {"form": form}, status=status)


@require_http_methods(["GET", "POST"])
@requires(Perm.MANAGE_WEBHOOKS)
def destination_edit(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    destination = _get_destination(pk)
    form = DestinationForm.for_destination(destination, request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            services.update_notification_destination(
                destination, actor=actor_from_request(request), **form.cleaned_data
            )
        except ValidationError as exc:
            form.add_service_error(exc)
        else:
            messages.success(request, f"Destination {destination.name} saved.")
            return redirect("intake:destination", pk=destination.pk)
    status = 400 if form.errors else 200
    context = {"form": form, "destination": destination}
    return render(request, "intake/destination_form.html", context, status=status)


@require_http_methods(["GET", "POST"])
@requires(Perm.MANAGE_WEBHOOKS)
def destination_delete(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    destination = _get_destination(pk)
    if request.method == "POST":
        services.remove_notification_destination(destination, actor=actor_from_request(request))
        messages.success(request, f"Destination {destination.name} removed.")
        return redirect("intake:destination_list")
    return render(request, "intake/destination_delete.html", {"destination": destination})


@require_POST
@requires(Perm.MANAGE_WEBHOOKS)
def destination_secret(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    destination = _get_destination(pk)
    secret = services.regenerate_destination_secret(destination, actor=actor_from_request(request))
    response = redirect("intake:destination_secret_shown", pk=destination.pk)
    return stash_secret(request, response, kind="destination", pk=destination.pk, secret=secret)


@require_GET
@requires(Perm.MANAGE_WEBHOOKS)
def destination_secret_shown(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """A destination's new signing secret (created or regenerated), shown once."""
    destination = _get_destination(pk)
    taken = take_secret(request, kind="destination", pk=destination.pk)
    if taken is None:
        messages.info(
            request,
            f"The signing secret of {destination.name} was shown once and is not shown "
            "again; regenerate it if it was not copied.",
        )
        return redirect("intake:destination", pk=destination.pk)
    secret, extra = taken
    context = {"destination": destination, "secret": secret, "created": bool(extra.get("created"))}
    return shown_once(render(request, "intake/destination_secret.html", context))


@require_POST
@requires(Perm.MANAGE_WEBHOOKS)
def destination_test(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    destination = _get_destination(pk)
    try:
        services.send_test_notification(destination, actor=actor_from_request(request))
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        messages.success(request, "Test notification queued; its attempts appear below.")
    return redirect("intake:destination", pk=destination.pk)
