"""The provenance page of a weight version (read-only, for every role that may view)."""

from __future__ import annotations

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from controlplane.accounts.access import requires
from controlplane.accounts.roles import Perm
from controlplane.intake.provenance.trail import trail
from controlplane.refresh.step_order import STEP_LABELS, WORKER_STEPS


@require_GET
@requires(Perm.VIEW)
def version_provenance(request: HttpRequest, version: str) -> HttpResponse:
    found = trail(version)
    if found.empty:
        raise Http404("no record names this weight version")
    context = {
        "trail": found,
        "steps": [(step.value, STEP_LABELS[step]) for step in WORKER_STEPS],
    }
    return render(request, "provenance/version.html", context)
