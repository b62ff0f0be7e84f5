"""Policy refresh pages: list, plan form → preview → confirm, live progress, gates, actions.

Every mutating view is POST-only, checks its permission server-side, and calls one action
function (which audits). Errors a person can act on come back as messages on the page.
"""

from __future__ import annotations

from collections.abc import Callable

from django.contrib import messages
from django.contrib.auth.decorators import login_required, permission_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from controlplane.accounts.roles import Perm
from controlplane.audit.recorder import actor_from_request
from controlplane.refresh import actions, presenters
from controlplane.refresh.errors import RefreshError
from controlplane.refresh.forms import PlanForm
from controlplane.refresh.models import (
    ACTIVE_STATES,
    Gate,
    PolicyRefresh,
    RefreshState,
)


def _refresh_for(request: HttpRequest, pk: int, perm: Perm = Perm.VIEW) -> PolicyRefresh:
    """The refresh, if the user may act on it with `perm`; else PermissionDenied."""
    if not request.user.has_perm(perm):
        raise PermissionDenied
    return get_object_or_404(PolicyRefresh.objects.select_related("source"), pk=pk)


@require_GET
@permission_required(Perm.VIEW, raise_exception=True)
def refresh_list(request: HttpRequest) -> HttpResponse:
    refreshes = PolicyRefresh.objects.select_related("source").order_by("-id")
    context = {
        "active": [r for r in refreshes.filter(state__in=ACTIVE_STATES) if r.state != "held"],
        "held": list(refreshes.filter(state=RefreshState.HELD)),
        "completed": list(refreshes.exclude(state__in=ACTIVE_STATES)[:100]),
    }
    return render(request, "refresh/list.html", context)


@require_http_methods(["GET", "POST"])
@login_required
def plan(request: HttpRequest) -> HttpResponse:
    if not request.user.has_perm(Perm.OPERATE_REFRESH):
        raise PermissionDenied
    form = PlanForm(request.POST or None, initial={"source": request.GET.get("source")})
    if request.method == "POST" and form.is_valid():
        try:
            refresh = actions.plan_policy_refresh(
                actor=actor_from_request(request), **form.plan_kwargs()
            )
        except ValidationError as exc:
            form.add_error(None, exc)
        else:
            return redirect("refresh:detail", pk=refresh.pk)
    return render(request, "refresh/plan.html", {"form": form})


@require_GET
@login_required
def detail(request: HttpRequest, pk: int) -> HttpResponse:
    refresh = _refresh_for(request, pk)
    context = presenters.detail_context(refresh)
    template = "refresh/detail.html#live" if request.htmx else "refresh/detail.html"
    return render(request, template, context)


@require_GET
@login_required
def refresh_actions(request: HttpRequest, pk: int) -> HttpResponse:
    """The action buttons alone, rendered for this user (permissions, CSRF token).

    The live stream cannot render them — it has no request — so its fragment asks for them.
    """
    refresh = _refresh_for(request, pk)
    context = {
        "refresh": refresh,
        "is_active": refresh.state in ACTIVE_STATES,
        "can_end": actions.can_end(refresh),
    }
    return render(request, "refresh/detail.html#actions", context)


def _act(perm: Perm, run: Callable, success: str):
    """A POST view that runs one action and reports its outcome as a message."""

    @require_POST
    @login_required
    def view(request: HttpRequest, pk: int) -> HttpResponse:
        refresh = _refresh_for(request, pk, perm)
        try:
            result = run(refresh, request)
        except (RefreshError, ValidationError) as exc:
            messages.error(request, getattr(exc, "message", None) or "; ".join(exc.messages))
            return redirect("refresh:detail", pk=refresh.pk)
        messages.success(request, success)
        target = result if isinstance(result, PolicyRefresh) else refresh
        return redirect("refresh:detail", pk=target.pk)

    return view


start = _act(
    Perm.OPERATE_REFRESH,
    lambda r, req: actions.start_policy_refresh(r, actor=actor_from_request(req)),
    "Policy refresh started.",
)
approve = _act(
    Perm.APPROVE_REFRESH,
    lambda r, req: actions.approve_policy_refresh(r, actor=actor_from_request(req)),
    "Approved; the refresh is running.",
)
reject = _act(
    Perm.APPROVE_REFRESH,
    lambda r, req: actions.reject_policy_refresh(
        r, actor=actor_from_request(req), reason=req.POST.get("reason", "")
    ),
    "Rejected.",
)
abort = _act(
    Perm.OPERATE_REFRESH,
    lambda r, req: actions.abort_policy_refresh(
        r, actor=actor_from_request(req), resume_engines=req.POST.get("resume_engines") == "1"
    ),
    "Abort requested; the refresh stops at the next call boundary.",
)
retry = _act(
    Perm.OPERATE_REFRESH,
    lambda r, req: actions.retry_policy_refresh(r, actor=actor_from_request(req)),
    "Retrying the failed step on failed and unreached workers.",
)
end = _act(
    Perm.APPROVE_REFRESH,
    lambda r, req: actions.end_policy_refresh(
        r, actor=actor_from_request(req), reason=req.POST.get("reason", "")
    ),
    "Ended; the scope is free and its gates stay closed.",
)
rollback = _act(
    Perm.OPERATE_REFRESH,
    lambda r, req: actions.rollback_policy_refresh(r, actor=actor_from_request(req)),
    "Rolling back to the last verified policy.",
)


@require_GET
@permission_required(Perm.VIEW, raise_exception=True)
def gate_list(request: HttpRequest) -> HttpResponse:
    context = {"banner_gates": presenters.gates_of()}
    template = "refresh/gates.html#gates" if request.htmx else "refresh/gates.html"
    return render(request, template, context)


@require_POST
@login_required
def force_reopen(request: HttpRequest, pk: int) -> HttpResponse:
    if not request.user.has_perm(Perm.FORCE_REOPEN):
        raise PermissionDenied
    gate = get_object_or_404(Gate, pk=pk)
    try:
        actions.force_reopen_gate(
            gate, actor=actor_from_request(request), reason=request.POST.get("reason", "")
        )
    except (RefreshError, ValidationError) as exc:
        messages.error(request, getattr(exc, "message", None) or "; ".join(exc.messages))
    else:
        messages.success(request, f"Gate {gate.namespace} force-reopened.")
    return redirect("refresh:gates")
