from django.contrib.auth.decorators import permission_required
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import render
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.views.decorators.http import require_GET

from controlplane.audit.chain_status import chain_status
from controlplane.audit.export import EXPORTERS
from controlplane.audit.forms import AuditFilterForm
from controlplane.audit.models import AuditEvent
from controlplane.requests import HtmxHttpRequest

PAGE_SIZE = 50
#: `accounts.roles.Perm.VIEW`, by its Django permission name: audit sits below accounts (which
#: records audit rows), so it names the permission instead of importing it. A test keeps the
#: two equal.
VIEW_PERMISSION = "accounts.view_controlplane"


#: Targets with a page of their own, by `target_type` (a model's `_meta.label_lower`), and the
#: URL name showing one by its id. Named, not imported: audit sits below the feature apps.
TARGET_PAGES = {
    "fleet.source": "fleet:source",
    "fleet.worker": "fleet:worker",
    "refresh.policyrefresh": "refresh:detail",
    "refresh.drillrun": "refresh:drill",
}


def target_url(event: AuditEvent) -> str:
    """The page of the event's target, or "" when it has none (or a malformed id)."""
    name = TARGET_PAGES.get(event.target_type)
    if name is None or not event.target_id.isdigit():
        return ""
    try:
        return reverse(name, args=[int(event.target_id)])
    except NoReverseMatch:
        return ""


def _filtered_events(request: HttpRequest):
    form = AuditFilterForm(request.GET or None)
    events = AuditEvent.objects.order_by("-sequence")
    if form.is_bound and form.is_valid():
        events = form.filter(events)
    elif form.is_bound:
        events = events.none()
    return form, events


@require_GET
@permission_required(VIEW_PERMISSION, raise_exception=True)
def history(request: HtmxHttpRequest) -> HttpResponse:
    form, events = _filtered_events(request)
    page = Paginator(events, PAGE_SIZE).get_page(request.GET.get("page"))
    for event in page:
        event.target_url = target_url(event)
    query = request.GET.copy()
    query.pop("page", None)
    context = {"form": form, "page": page, "query": query.urlencode()}
    if request.htmx:  # paging and filters swap the table alone; the status stays as drawn
        return render(request, "audit/history.html#events", context)
    return render(request, "audit/history.html", context | {"chain": chain_status()})


@require_GET
@permission_required(VIEW_PERMISSION, raise_exception=True)
def export(request: HttpRequest) -> HttpResponse | StreamingHttpResponse:
    fmt = request.GET.get("format", "jsonl")
    if fmt not in EXPORTERS:
        return HttpResponse(
            f"unknown format {fmt!r}; use jsonl or csv", status=400, content_type="text/plain"
        )
    _, events = _filtered_events(request)
    stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
    response = StreamingHttpResponse(
        EXPORTERS[fmt](events.order_by("sequence").iterator(chunk_size=2000)),
        content_type="text/csv" if fmt == "csv" else "application/x-ndjson",
    )
    response["Content-Disposition"] = f'attachment; filename="audit-{stamp}.{fmt}"'
    return response
