"""The canary analysis page (`/refreshes/<id>/analysis/`): read-only, for anyone who may view."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET

from controlplane.accounts.access import requires
from controlplane.accounts.roles import Perm
from controlplane.refresh.analysis_page import page_context
from controlplane.refresh.models import PolicyRefresh


@require_GET
@requires(Perm.VIEW)
def analysis_report(request: HttpRequest, pk: int) -> HttpResponse:
    refresh = get_object_or_404(PolicyRefresh.objects.select_related("source"), pk=pk)
    return render(request, "refresh/analysis.html", page_context(refresh))
