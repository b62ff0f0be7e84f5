"""A source's analysis templates: list, read (the latest version or `?version=N`) and PUT (a
new version). Saving goes through `analysis.services.save_template`, which validates, audits
and changes nothing on bad input; a body that does not validate is a 400 `invalid_template`
whose details name each field at fault (`judge.pass_score`, `prompts[3].prompt`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.core.exceptions import ValidationError
from django.http import HttpRequest
from ninja import Query, Router, Schema, Status
from pydantic import Field

from controlplane.accounts.roles import Perm
from controlplane.analysis import services
from controlplane.analysis.models import NOTE_CHARS, AnalysisTemplate
from controlplane.intake.api.auth import actor, require, source_or_404
from controlplane.intake.api.errors import COMMON_ERRORS, ApiError
from controlplane.intake.api.pagination import PageParams, page_of, paginate

router = Router(tags=["analysis templates"])

BODY_HELP = (
    "the template: prompts (token ids, with an optional reference continuation), judge "
    "(metrics, group weights, pass/marginal thresholds, alpha, min_samples), min_prompts, "
    "max_tokens, background. Absent fields take their defaults; the stored body has them all "
    "(docs/operate/canary-analysis-templates.md)"
)


class TemplateSummaryOut(Schema):
    name: str
    version: int = Field(description="the latest version")
    prompts: int = Field(description="how many prompts the latest version has")
    created_at: datetime
    created_by: str
    note: str


class TemplateOut(Schema):
    source: str
    name: str
    version: int
    created_at: datetime
    created_by: str
    note: str
    body: dict[str, Any] = Field(description=BODY_HELP)
    versions: list[int] = Field(description="every version of this template, newest first")


class TemplateIn(Schema):
    body: dict[str, Any] = Field(description=BODY_HELP)
    note: str = Field("", max_length=NOTE_CHARS, description="why this version")


class VersionQuery(Schema):
    version: int | None = Field(None, ge=1, le=2**31 - 1, description="default: the latest")


def _summary(t: AnalysisTemplate) -> dict[str, Any]:
    return {
        "name": t.name,
        "version": t.version,
        "prompts": len(t.body.get("prompts", [])),
        "created_at": t.created_at,
        "created_by": t.created_by,
        "note": t.note,
    }


def _full(t: AnalysisTemplate) -> dict[str, Any]:
    versions = services.versions_of(t.source, t.name).values_list("version", flat=True)
    return {
        "source": t.source.name,
        "name": t.name,
        "version": t.version,
        "created_at": t.created_at,
        "created_by": t.created_by,
        "note": t.note,
        "body": t.body,
        "versions": list(versions),
    }


@router.get(
    "/sources/{name}/analysis-templates",
    response={200: page_of(TemplateSummaryOut), **COMMON_ERRORS},
)
def list_analysis_templates(request: HttpRequest, name: str, page: Query[PageParams]):
    """The source's analysis templates, each at its latest version, by name."""
    require(request, Perm.VIEW)
    source = source_or_404(request, name)
    return paginate(services.templates_of(source), page, _summary)


@router.get(
    "/sources/{name}/analysis-templates/{template}",
    response={200: TemplateOut, **COMMON_ERRORS},
)
def get_analysis_template(
    request: HttpRequest, name: str, template: str, query: Query[VersionQuery]
):
    """One template: its latest version, or the one `?version=` names."""
    require(request, Perm.VIEW)
    source = source_or_404(request, name)
    found = services.get_version(source, template, query.version)
    if found is None:
        what = f"version {query.version} of " if query.version else ""
        raise ApiError(404, "not_found", f"no {what}analysis template {template!r} on {name!r}")
    return _full(found)


@router.put(
    "/sources/{name}/analysis-templates/{template}",
    response={200: TemplateOut, 201: TemplateOut, **COMMON_ERRORS},
)
def put_analysis_template(request: HttpRequest, name: str, template: str, payload: TemplateIn):
    """Save `body` as the template's next version (201). A body identical to the latest
    version's writes nothing and answers 200 with that version."""
    require(request, Perm.MANAGE_SOURCES)
    source = source_or_404(request, name)
    before = services.get_version(source, template)
    try:
        saved = services.save_template(
            source, template, payload.body, actor=actor(request), note=payload.note
        )
    except ValidationError as exc:
        details = exc.message_dict if hasattr(exc, "error_dict") else {"__all__": exc.messages}
        message = "; ".join(f"{k}: {m[0]}" for k, m in list(details.items())[:3])
        raise ApiError(400, "invalid_template", message[:500], details) from None
    created = before is None or saved.version != before.version
    return Status(201 if created else 200, _full(saved))
