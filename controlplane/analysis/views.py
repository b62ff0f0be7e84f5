"""Analysis template pages: a source's templates with a form to save a new version, and one
template's versions, any of which can be read whole.

Saving goes through `services.save_template`, which checks the permission and writes the audit
row; the form is only offered to those who may save.
"""

from __future__ import annotations

import re

from django.contrib import messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_http_methods

from controlplane.accounts.access import requires
from controlplane.accounts.roles import Perm
from controlplane.analysis import services
from controlplane.analysis.forms import TemplateForm, pretty
from controlplane.analysis.spec import TemplateSpec, default_judge
from controlplane.audit.recorder import actor_from_request
from controlplane.fleet.models import Source
from controlplane.requests import HtmxHttpRequest

#: `?version=`: ASCII digits that fit the column (anything else, even "²", is simply not found).
VERSION_TEXT = re.compile(r"[0-9]{1,9}")


def _get_source(name: str) -> Source:
    return get_object_or_404(Source, name=name)


def _starter_body() -> str:
    """What a new template's form starts with: every default filled in, no prompts yet."""
    return pretty(TemplateSpec(prompts=(), judge=default_judge()).to_dict())


def _can_edit(request: HtmxHttpRequest) -> bool:
    return request.user.has_perm(Perm.MANAGE_SOURCES)


@require_http_methods(["GET", "POST"])
@requires(Perm.VIEW)
def template_list(request: HtmxHttpRequest, source: str) -> HttpResponse:
    """The source's templates (latest version of each) and the form that saves a version;
    POST saves; whoever may not is refused before anything is looked up (the service checks
    again: every interface saves through it)."""
    if request.method == "POST" and not _can_edit(request):
        raise PermissionDenied
    src = _get_source(source)
    form = TemplateForm(request.POST or None, request.FILES or None)
    if request.method == "POST" and form.is_valid():
        try:
            template = services.save_template(
                src,
                form.cleaned_data["name"],
                form.template_json(),
                actor=actor_from_request(request),
                note=form.cleaned_data["note"],
            )
        except ValidationError as exc:
            form.add_service_error(exc)
        else:
            messages.success(request, f"Template {template.name} is at version {template.version}.")
            return redirect("analysis:template", source=src.name, name=template.name)
    elif request.method == "GET":
        form = TemplateForm(initial={"body": _starter_body()})
    context = {
        "source": src,
        "templates": services.templates_of(src),
        "form": form,
        "can_edit": _can_edit(request),
    }
    status = 400 if form.errors else 200
    return render(request, "analysis/templates.html", context, status=status)


@require_GET
@requires(Perm.VIEW)
def template_detail(request: HtmxHttpRequest, source: str, name: str) -> HttpResponse:
    """One template: the version asked for (`?version=N`, else the latest) read whole, its
    version history, and the form to save the next version, starting from this one."""
    src = _get_source(source)
    raw_version = request.GET.get("version", "")
    if raw_version and not VERSION_TEXT.fullmatch(raw_version):
        raise Http404("no such version")
    template = services.get_version(src, name, int(raw_version) if raw_version else None)
    if template is None:
        raise Http404("no such template")
    try:
        spec = services.spec_of(template)
        problems: list[str] = []
    except ValidationError as exc:
        # Stored under older limits: shown as it is, with what a plan would refuse it for.
        spec = None
        problems = [f"{k}: {m}" for k, ms in exc.message_dict.items() for m in ms]
    form = TemplateForm(
        initial={"name": template.name, "body": pretty(template.body)}, auto_id="id_%s"
    )
    versions = list(
        services.versions_of(src, name).only(
            "version", "created_at", "created_by", "note", "name", "source_id"
        )
    )
    context = {
        "source": src,
        "template": template,
        "spec": spec,
        "problems": problems,
        "body_text": pretty(template.body),
        "versions": versions,
        "is_latest": template.version == versions[0].version,
        "form": form,
        "can_edit": _can_edit(request),
    }
    return render(request, "analysis/template.html", context)
