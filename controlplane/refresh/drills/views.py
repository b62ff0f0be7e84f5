"""Drill pages: start one from the source page (POST), and one drill's detail."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from controlplane.accounts.access import requires
from controlplane.accounts.roles import Perm
from controlplane.audit.recorder import actor_from_request
from controlplane.fleet.models import Source
from controlplane.refresh.drills.actions import start_drill
from controlplane.refresh.errors import RefreshError
from controlplane.refresh.models import DrillRun


@require_POST
@requires(Perm.OPERATE_REFRESH)
def drill_start(request: HttpRequest, pk: int) -> HttpResponse:
    source = get_object_or_404(Source, pk=pk)
    try:
        drill = start_drill(source, actor=actor_from_request(request))
    except (RefreshError, ValidationError) as exc:
        message = exc.message if isinstance(exc, RefreshError) else "; ".join(exc.messages)
        messages.error(request, f"Rollback drill not started: {message}")
        return redirect("fleet:source", pk=source.pk)
    messages.success(
        request,
        f"Rollback drill #{drill.pk} started: {len(drill.instances)} worker(s) to "
        f"{drill.previous_version} and back.",
    )
    return redirect("refresh:drill", pk=drill.pk)


@require_GET
@requires(Perm.VIEW)
def drill_detail(request: HttpRequest, pk: int) -> HttpResponse:
    drill = get_object_or_404(
        DrillRun.objects.select_related("source", "forward_refresh", "back_refresh"), pk=pk
    )
    return render(request, "refresh/drill.html", {"drill": drill})
