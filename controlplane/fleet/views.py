"""Fleet pages: overview, source, worker, and the admin forms for sources and static workers.

Small function views. Each checks its permission with `@requires`; each object type has one
access helper that returns the object (or 404); every mutating view goes through a service,
which writes the audit row.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from controlplane.accounts.access import requires
from controlplane.accounts.roles import Perm
from controlplane.audit.recorder import actor_from_request
from controlplane.fleet import charts, live, services
from controlplane.fleet import serving_health as health
from controlplane.fleet.discovery.rejections import latest_rejections
from controlplane.fleet.filters import WorkerFilter
from controlplane.fleet.forms import SourceForm, StaticWorkerForm
from controlplane.fleet.models import Source, StaticWorker, Worker, WorkerState
from controlplane.fleet.presenters import filter_options, summarise, summarise_all
from controlplane.fleet.rows import (
    HEADERS,
    pager,
    render_rows,
    render_timeline,
    sort_headers,
)
from controlplane.requests import HtmxHttpRequest


def _get_source(pk: int) -> Source:
    return get_object_or_404(Source, pk=pk)


def _get_worker(pk: int) -> Worker:
    return get_object_or_404(Worker.objects.select_related("source", "static_worker"), pk=pk)


def _get_static_worker(pk: int) -> StaticWorker:
    return get_object_or_404(StaticWorker.objects.select_related("source"), pk=pk)


@require_GET
@requires(Perm.VIEW)
def overview(request: HtmxHttpRequest) -> HttpResponse:
    summaries = summarise_all(Source.objects.all())
    context = {"summaries": summaries}
    return render(request, "fleet/overview.html", context)


@require_GET
@requires(Perm.VIEW)
def source_detail(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """One page of the source's workers, filtered, searched and sorted by the database.

    Everything on it costs a constant number of queries: the summary and the filter choices
    are aggregates, the table is one page (`filters.PAGE_SIZE` rows) whatever the fleet size.
    """
    source = _get_source(pk)
    flt = WorkerFilter.from_query(request.GET)
    page = flt.page_of(source)
    flt = flt.with_page(page.number)  # a page past the end shows (and links) the last one
    context = {
        "source": source,
        "summary": summarise(source),
        "filter": flt,
        "page": page,
        "pager": pager(flt, page),
        "rows_html": render_rows(page.object_list),
        "row_count": page.paginator.count,
        "headers": sort_headers(flt),
        "options": filter_options(source),
        "states": WorkerState.values,
        "events_html": render_timeline(live.timeline(source)),
        "can_run_discovery": request.user.has_perm(Perm.RUN_DISCOVERY),
        "can_manage": request.user.has_perm(Perm.MANAGE_SOURCES),
        "static_workers": source.static_workers.select_related("worker"),
        "rejected_entries": latest_rejections(source),
    }
    template = "fleet/source.html#workers" if request.htmx else "fleet/source.html"
    return render(request, template, context)


@require_GET
@requires(Perm.VIEW)
def source_map(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """The fleet map's page: one cell per worker, one query, its data in the page. The source
    page links here (without a script) and re-reads this fragment when a push says the fleet
    changed; its first map comes from `source_map_data`."""
    source = _get_source(pk)
    template = "fleet/_charts_map.html#map" if request.htmx else "fleet/_charts_map.html"
    return render(request, template, {"source": source})


@require_GET
@requires(Perm.VIEW)
def source_map_data(request: HtmxHttpRequest, pk: int) -> JsonResponse:
    """The fleet map's data as JSON, for the source page: its head preloads this URL, so the
    map's one query runs while the page itself loads rather than after its first screen; the
    page's script draws it (static/js/fleet_map.js)."""
    return JsonResponse(charts.fleet_map(_get_source(pk)).as_data())


@require_GET
@requires(Perm.VIEW)
def serving_health(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """The source's serving health charts (fleet/serving_health.py), polled by the fragment
    itself every sample interval while the page is open."""
    source = _get_source(pk)
    context = {
        "source": source,
        "health": health.health_view(source) if source.frontend_url else None,
        "poll_seconds": f"{settings.SERVING_HEALTH_SAMPLE_SECONDS:g}",
    }
    return render(request, "fleet/_serving_health.html", context)


@require_GET
@requires(Perm.VIEW)
def worker_detail(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    worker = _get_worker(pk)
    context = {
        "worker": worker,
        "source": worker.source,
        "row": render_rows([worker]),
        "headers": HEADERS,
        "events": worker.events.select_related("run").order_by("-occurred_at", "-id")[:200],
    }
    return render(request, "fleet/worker.html", context)


@require_POST
@requires(Perm.RUN_DISCOVERY)
def run_discovery(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    source = _get_source(pk)
    services.request_discovery(source, actor=actor_from_request(request))
    if request.htmx:
        return HttpResponse('<span class="muted" role="status">Discovery requested…</span>')
    messages.success(request, f"Discovery of {source.name} requested.")
    return redirect("fleet:source", pk=source.pk)


@require_http_methods(["GET", "POST"])
@requires(Perm.MANAGE_SOURCES)
def source_create(request: HtmxHttpRequest) -> HttpResponse:
    form = SourceForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            source = services.create_source(actor=actor_from_request(request), **form.cleaned_data)
        except ValidationError as exc:
            form.add_service_error(exc)
        else:
            messages.success(request, f"Source {source.name} created.")
            return redirect("fleet:source", pk=source.pk)
    status = 400 if form.errors else 200
    return render(request, "fleet/source_form.html", {"form": form}, status=status)


@require_http_methods(["GET", "POST"])
@requires(Perm.MANAGE_SOURCES)
def source_edit(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    source = _get_source(pk)
    form = SourceForm.for_source(source, request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            services.update_source(source, actor=actor_from_request(request), **form.cleaned_data)
        except ValidationError as exc:
            form.add_service_error(exc)
        else:
            messages.success(request, f"Source {source.name} saved.")
            return redirect("fleet:source", pk=source.pk)
    status = 400 if form.errors else 200
    context = {"form": form, "source": source}
    return render(request, "fleet/source_form.html", context, status=status)


@require_http_methods(["GET", "POST"])
@requires(Perm.MANAGE_SOURCES)
def source_delete(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    source = _get_source(pk)
    if request.method == "POST":
        services.remove_source(source, actor=actor_from_request(request))
        messages.success(request, f"Source {source.name} removed.")
        return redirect("fleet:overview")
    return render(request, "fleet/source_delete.html", {"source": source})


@require_http_methods(["GET", "POST"])
@requires(Perm.MANAGE_SOURCES)
def static_worker_create(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    source = _get_source(pk)
    form = StaticWorkerForm(request.POST or None, source=source)
    if request.method == "POST" and form.is_valid():
        try:
            static = services.add_static_worker(
                source, actor=actor_from_request(request), **form.cleaned_data
            )
        except ValidationError as exc:
            form.add_service_error(exc)
        else:
            messages.success(request, f"Static worker {static.name} added.")
            return redirect("fleet:source", pk=source.pk)
    status = 400 if form.errors else 200
    context = {"form": form, "source": source}
    return render(request, "fleet/static_worker_form.html", context, status=status)


@require_POST
@requires(Perm.MANAGE_SOURCES)
def static_worker_delete(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    static = _get_static_worker(pk)
    source_pk = static.source_id
    services.remove_static_worker(static, actor=actor_from_request(request))
    messages.success(request, f"Static worker {static.name} removed.")
    return redirect("fleet:source", pk=source_pk)
