"""`/search/?q=`: the results page of the search box in the top bar."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from controlplane.accounts.access import requires
from controlplane.accounts.roles import Perm
from controlplane.intake.search import LIMIT, search


@require_GET
@requires(Perm.VIEW)
def search_page(request: HttpRequest) -> HttpResponse:
    # Signed-in people see every source (roles are not per source); a scoped API token would
    # pass its `allowed_source_ids` here.
    results = search(request.GET.get("q", ""), source_ids=None)
    return render(request, "search/results.html", {"results": results, "limit": LIMIT})
