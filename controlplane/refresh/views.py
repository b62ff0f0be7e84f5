"""Policy refresh pages: plan form → preview → confirm, live progress, gates, actions.

Every view checks its permission with `@requires`; every mutating view is POST-only and runs
one row of the action table (`refresh.action_table`), whose action function audits. Errors a
person can act on come back as messages on the page.
"""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from controlplane.accounts.access import requires
from controlplane.accounts.roles import Perm
from controlplane.audit.recorder import actor_from_request
from controlplane.fleet.models import Source, Worker
from controlplane.refresh import intents, presenters
from controlplane.refresh.errors import RefreshError
from controlplane.refresh.forms import (
    PlanForm,
    RollbackForm,
    SourceStrategyForm,
    method_field_groups,
)
from controlplane.refresh.intents import recovery
from controlplane.refresh.intents.action_table import (
    ABORT,
    APPROVE,
    APPROVE_CANARY,
    CONTINUE,
    DISCARD,
    DROP_QUARANTINE,
    END,
    FORCE_REOPEN,
    FORCE_REOPEN_NAMESPACE,
    PAUSE_AT_NEXT_WAVE,
    REJECT,
    REJECT_CANARY,
    RELEASE_QUARANTINE,
    REOPEN_VERIFIED,
    RESOLVE_MEMBERSHIP,
    RETRY,
    RETRY_QUARANTINE,
    ROLLBACK,
    START,
    Action,
    ActionInput,
)
from controlplane.refresh.models import (
    Gate,
    PolicyRefresh,
    Quarantine,
    RefreshState,
)
from controlplane.refresh.source_strategy import set_default_strategy
from controlplane.requests import HtmxHttpRequest


def _get_refresh(pk: int) -> PolicyRefresh:
    return get_object_or_404(PolicyRefresh.objects.select_related("source"), pk=pk)


def _given(request: HttpRequest) -> ActionInput:
    return ActionInput(
        reason=request.POST.get("reason", ""),
        resume_engines=request.POST.get("resume_engines") == "1",
        namespace=request.POST.get("namespace", ""),
    )


def _error_message(exc: RefreshError | ValidationError) -> str:
    if isinstance(exc, RefreshError):
        return exc.message
    return getattr(exc, "message", None) or "; ".join(exc.messages)


@require_http_methods(["GET", "POST"])
@requires(Perm.OPERATE_REFRESH)
def plan(request: HttpRequest) -> HttpResponse:
    form = PlanForm(request.POST or None, initial={"source": request.GET.get("source")})
    if request.method == "POST" and form.is_valid():
        try:
            refresh = intents.plan_policy_refresh(
                actor=actor_from_request(request), **form.plan_kwargs()
            )
        except ValidationError as exc:
            form.add_error(None, exc)
        else:
            return redirect("refresh:detail", pk=refresh.pk)
    context = {"form": form, "method_groups": method_field_groups(form)}
    return render(request, "refresh/plan.html", context)


@require_http_methods(["GET", "POST"])
@requires(Perm.OPERATE_REFRESH)
def rollback_plan(request: HttpRequest, pk: int) -> HttpResponse:
    """Roll back through a plan: choose an earlier verified version of the source (its
    revision history) and the namespaces; the plan is shown on the plan page to review and
    start (`?of=<id>`: the refresh being rolled back, whose page links here)."""
    source = get_object_or_404(Source, pk=pk)
    of_id = request.POST.get("of") or request.GET.get("of") or ""
    of = None
    if of_id:
        if not of_id.isdigit() or len(of_id) > 12:
            return HttpResponse("bad refresh id", status=400)
        of = get_object_or_404(PolicyRefresh.objects.select_related("source"), pk=int(of_id))
    page = presenters.rollback_page(source, of)
    form = RollbackForm(
        request.POST or None,
        revisions=page.revisions,
        namespaces=page.namespaces,
        initial=page.initial,
    )
    if request.method == "POST" and form.is_valid():
        try:
            refresh = recovery.plan_rollback(
                source,
                actor=actor_from_request(request),
                version=form.cleaned_data["version"],
                namespaces=form.cleaned_data["namespaces"],
                of=of,
            )
        except ValidationError as exc:
            form.add_error(None, exc)
        else:
            messages.success(request, "Rollback planned: review it, then start it.")
            return redirect("refresh:detail", pk=refresh.pk)
    return render(request, "refresh/plan_rollback.html", {"form": form, "page": page})


@require_GET
@requires(Perm.VIEW)
def detail(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """The refresh page: one page of its worker-by-step grid (filter, search and page in the
    URL) and one page of its calls (filtered by result, worker, step: `j_` parameters); htmx
    paging gets the grid (and its live stream) or the journal alone."""
    refresh = _get_refresh(pk)
    context = presenters.detail_context(
        refresh,
        presenters.GridFilter.from_query(request.GET),
        presenters.JournalFilter.from_query(request.GET),
    )
    template = "refresh/detail.html"
    if request.htmx and request.headers.get("HX-Target") == "refresh-journal":
        return render(request, template + "#journal", context)
    if request.htmx:
        planned = refresh.state == RefreshState.PLANNED
        template += "#plan-grid" if planned else "#stream"
    return render(request, template, context)


@require_GET
@requires(Perm.VIEW)
def refresh_actions(request: HttpRequest, pk: int) -> HttpResponse:
    """The action buttons alone, rendered for this user (permissions, CSRF token).

    The live stream cannot render them — it has no request — so its fragment asks for them.
    """
    refresh = _get_refresh(pk)
    context = {"refresh": refresh} | presenters.actions_context(refresh)
    return render(request, "refresh/detail.html#actions", context)


@require_GET
@requires(Perm.VIEW)
def worker_timeline(request: HttpRequest, pk: int) -> HttpResponse:
    """The per-worker rows of the phase timeline alone: a pushed head fetches them (they are
    too heavy to travel with every state change to every watcher)."""
    return render(request, "refresh/_worker_timeline.html", {"refresh": _get_refresh(pk)})


def _act(action: Action[PolicyRefresh]):
    """A POST view that runs one action and reports its outcome as a message."""

    @require_POST
    @requires(action.perm)
    def view(request: HttpRequest, pk: int) -> HttpResponse:
        refresh = _get_refresh(pk)
        try:
            result = action.run(refresh, actor_from_request(request), _given(request))
        except (RefreshError, ValidationError) as exc:
            messages.error(request, _error_message(exc))
            return redirect("refresh:detail", pk=refresh.pk)
        messages.success(request, action.message(result))
        return redirect("refresh:detail", pk=result.pk)

    return view


_start_plan = _act(START)


@require_POST
@requires(START.perm)
def start(request: HttpRequest, pk: int) -> HttpResponse:
    """Confirm a plan. A planned rollback of a refresh still held or waiting takes that one's
    scope over as it starts (`recovery.start_rollback_plan`)."""
    refresh = _get_refresh(pk)
    if refresh.rollback_of_id is None:
        return _start_plan(request, pk)
    try:
        refresh = recovery.start_rollback_plan(refresh, actor=actor_from_request(request))
    except (RefreshError, ValidationError) as exc:
        messages.error(request, _error_message(exc))
    else:
        messages.success(request, START.message(refresh))
    return redirect("refresh:detail", pk=refresh.pk)


discard = _act(DISCARD)
approve = _act(APPROVE)
reject = _act(REJECT)
abort = _act(ABORT)
retry = _act(RETRY)
end = _act(END)
rollback = _act(ROLLBACK)
resolve_membership = _act(RESOLVE_MEMBERSHIP)
reopen_verified = _act(REOPEN_VERIFIED)
force_reopen_namespace = _act(FORCE_REOPEN_NAMESPACE)
pause_at_next_wave = _act(PAUSE_AT_NEXT_WAVE)
continue_refresh = _act(CONTINUE)
approve_canary = _act(APPROVE_CANARY)
reject_canary = _act(REJECT_CANARY)


@require_GET
@requires(Perm.VIEW)
def gate_list(request: HtmxHttpRequest) -> HttpResponse:
    """Every gate with its state, counts, since and reason; `/ws/gate-table/` keeps it live."""
    context = {"gate_rows": presenters.gate_rows()} | presenters.banner_context()
    template = "refresh/gates.html#gates" if request.htmx else "refresh/gates.html"
    return render(request, template, context)


@require_GET
@requires(Perm.VIEW)
def gate_actions(request: HttpRequest, pk: int) -> HttpResponse:
    """One gate's action form, rendered for this user (a streamed row asks for it)."""
    gate = get_object_or_404(Gate.objects.select_related("source"), pk=pk)
    context = {"gate": gate, "row": presenters.gate_row(gate)}
    return render(request, "refresh/gates.html#gate-actions", context)


@require_POST
@requires(FORCE_REOPEN.perm)
def force_reopen(request: HttpRequest, pk: int) -> HttpResponse:
    gate = get_object_or_404(Gate, pk=pk)
    try:
        gate = FORCE_REOPEN.run(gate, actor_from_request(request), _given(request))
    except (RefreshError, ValidationError) as exc:
        messages.error(request, _error_message(exc))
    else:
        messages.success(request, FORCE_REOPEN.message(gate))
    return redirect("refresh:gates")


# -- the exits of a quarantined worker (buttons on the worker page) -----------------------------

#: Exits that need a ticked confirmation on the page: release lets a worker serve outside the
#: verified set, drop forgets the quarantine for good.
CONFIRMED_EXITS = frozenset({RELEASE_QUARANTINE.name, DROP_QUARANTINE.name})


def _back_to_worker(q: Quarantine) -> HttpResponse:
    """The worker page the buttons are on (the current worker of that instance id, else the
    one the quarantine was opened for), or the source page when neither is known any more."""
    worker_id = (
        Worker.objects.filter(
            source_id=q.source_id, namespace=q.namespace, instance_id=q.instance_id
        )
        .order_by("-id")
        .values_list("pk", flat=True)
        .first()
    ) or q.worker_id
    if worker_id is not None:
        return redirect("fleet:worker", pk=worker_id)
    return redirect("fleet:source", pk=q.source_id)


def _quarantine_exit(action: Action[Quarantine]):
    """A POST view that runs one quarantine exit and reports its outcome as a message."""

    @require_POST
    @requires(action.perm)
    def view(request: HttpRequest, pk: int) -> HttpResponse:
        q = get_object_or_404(Quarantine.objects.select_related("source"), pk=pk)
        if action.name in CONFIRMED_EXITS and request.POST.get("confirm") != "1":
            messages.error(request, f"Tick the confirmation to {action.name} {q.key}.")
            return _back_to_worker(q)
        try:
            result = action.run(q, actor_from_request(request), _given(request))
        except ValidationError as exc:
            messages.error(request, _error_message(exc))
        else:
            messages.success(request, action.message(result))
        return _back_to_worker(q)

    return view


quarantine_retry = _quarantine_exit(RETRY_QUARANTINE)
quarantine_release = _quarantine_exit(RELEASE_QUARANTINE)
quarantine_drop = _quarantine_exit(DROP_QUARANTINE)


@require_http_methods(["GET", "POST"])
@requires(Perm.MANAGE_SOURCES)
def source_strategy(request: HttpRequest, pk: int) -> HttpResponse:
    """A source's default strategy: the one its plans get unless they name their own."""
    source = get_object_or_404(Source, pk=pk)
    form = SourceStrategyForm.for_source(source, request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            set_default_strategy(
                source, form.cleaned_data["strategy"], actor=actor_from_request(request)
            )
        except ValidationError as exc:
            form.add_error(None, exc)
        else:
            messages.success(request, "Default strategy saved.")
            return redirect("fleet:source", pk=source.pk)
    return render(request, "refresh/source_strategy.html", {"form": form, "source": source})
