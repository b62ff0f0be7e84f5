"""Audit events: list with the history page's filters, and streaming export."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from django.http import HttpRequest, StreamingHttpResponse
from django.utils import timezone
from ninja import Query, Router, Schema
from pydantic import Field

from controlplane.accounts.roles import Perm
from controlplane.audit.export import EXPORTERS, _row
from controlplane.audit.forms import AuditFilterForm
from controlplane.audit.models import AuditEvent
from controlplane.intake.api.auth import require, require_unlimited
from controlplane.intake.api.errors import COMMON_ERRORS, ApiError
from controlplane.intake.api.pagination import PageParams, page_of, paginate

router = Router(tags=["audit"])


class AuditEventOut(Schema):
    sequence: int
    occurred_at: datetime
    actor_type: str
    actor_label: str
    source_ip: str | None
    action: str
    target_type: str
    target_id: str
    target_label: str
    details: dict[str, Any]
    correlation_id: str
    previous_hash: str
    entry_hash: str


class AuditFilters(Schema):
    action: str | None = Field(None, max_length=64)
    actor: str | None = Field(None, max_length=200)
    target: str | None = Field(None, max_length=300, description="type:id, or label text")
    correlation_id: str | None = Field(None, max_length=64)
    since: datetime | None = None
    until: datetime | None = None


class AuditListParams(AuditFilters, PageParams):
    pass


class ExportParams(AuditFilters):
    format: Literal["jsonl", "csv"] = "jsonl"


def _filtered(request: HttpRequest, filters: AuditFilters):
    require(request, Perm.VIEW)
    require_unlimited(request)
    data = filters.model_dump(include=set(AuditFilters.model_fields), exclude_none=True)
    for bound in ("since", "until"):
        if bound in data:
            # PostgreSQL accepts offsets only up to ±15:59; a UTC instant is always in range.
            moment = data[bound]
            if moment.tzinfo is None:
                moment = moment.replace(tzinfo=UTC)
            try:
                data[bound] = moment.astimezone(UTC)
            except OverflowError:
                raise ApiError(422, "validation_error", f"{bound} is out of range") from None
    form = AuditFilterForm(
        {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in data.items()}
    )
    if not form.is_valid():
        raise ApiError(422, "validation_error", "invalid audit filter", form.errors.get_json_data())
    return form.filter(AuditEvent.objects.all())


@router.get("/audit/events", response={200: page_of(AuditEventOut), **COMMON_ERRORS})
def list_audit_events(request: HttpRequest, filters: Query[AuditListParams]):
    """Newest first. Fleet-wide, so tokens limited to some sources may not read it."""
    events = _filtered(request, filters).order_by("-sequence")
    return paginate(events, filters, _row)


@router.get(
    "/audit/events/export",
    response={200: str, **COMMON_ERRORS},
    openapi_extra={
        "responses": {
            200: {
                "description": "JSON lines or CSV, oldest first",
                "content": {
                    "application/x-ndjson": {"schema": {"type": "string"}},
                    "text/csv": {"schema": {"type": "string"}},
                },
            }
        }
    },
)
def export_audit_events(request: HttpRequest, filters: Query[ExportParams]):
    events = _filtered(request, filters).order_by("sequence")
    stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
    response = StreamingHttpResponse(
        EXPORTERS[filters.format](events.iterator(chunk_size=2000)),
        content_type="text/csv" if filters.format == "csv" else "application/x-ndjson",
    )
    response["Content-Disposition"] = f'attachment; filename="audit-{stamp}.{filters.format}"'
    return response
