from django.contrib.auth.decorators import permission_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from controlplane.accounts.roles import Perm
from controlplane.fleet.models import Source


@require_GET
@permission_required(Perm.VIEW, raise_exception=True)
def overview(request: HttpRequest) -> HttpResponse:
    sources = Source.objects.all()
    return render(request, "fleet/overview.html", {"sources": sources})
