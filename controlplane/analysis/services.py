"""Analysis template intents: save a new version, and the reads every interface shares.

The web form, the API and `manage.py analysis_template` all save through `save_template`: it
checks the permission, validates the body (`spec.parse_template`), writes the new version and
its audit row in one transaction, and changes nothing on bad input.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError
from django.core.validators import validate_slug
from django.db import transaction

from controlplane import lockorder
from controlplane.accounts.roles import Perm
from controlplane.analysis.models import NOTE_CHARS, AnalysisTemplate
from controlplane.analysis.spec import TemplateSpec, parse_template, require_min_prompts
from controlplane.audit.actions import AuditAction
from controlplane.audit.recorder import Actor, record
from controlplane.fleet.models import Source
from controlplane.textlimits import QUOTED_CHARS

NAME_CHARS = AnalysisTemplate._meta.get_field("name").max_length or 64


def may_edit(actor: Actor) -> bool:
    """Whether `actor` may save templates (a null user is the control plane or a command run
    by whoever has shell access: both may)."""
    return actor.user is None or actor.user.has_perm(Perm.MANAGE_SOURCES.value)


def _clean_name(name: Any) -> str:
    if not isinstance(name, str) or not name or len(name) > NAME_CHARS:
        raise ValidationError({"name": [f"must be 1 to {NAME_CHARS} characters"]})
    try:
        validate_slug(name)
    except ValidationError:
        raise ValidationError(
            {"name": ["letters, digits, hyphens and underscores only (a slug)"]}
        ) from None
    return name


def save_template(
    source: Source, name: str, raw: Any, *, actor: Actor, note: str = ""
) -> AnalysisTemplate:
    """Store `raw` as the next version of `source`'s template `name` and return that version.

    Saving a body identical to the latest version's (after defaults are filled in) writes
    nothing and returns the latest version. Raises PermissionDenied without MANAGE_SOURCES
    and ValidationError, keyed by field, on a bad name, note or body; either way nothing is
    stored.
    """
    if not may_edit(actor):
        raise PermissionDenied(f"{actor.label} may not change analysis templates")
    name = _clean_name(name)
    if not isinstance(note, str) or len(note) > NOTE_CHARS:
        raise ValidationError({"note": [f"at most {NOTE_CHARS} characters"]})
    body = parse_template(raw).to_dict()
    with transaction.atomic():
        # The source row serialises version numbers of its templates: two saves at once get
        # consecutive versions instead of one failing on the unique constraint.
        lockorder.domain_lock("fleet.Source")
        Source.objects.select_for_update(no_key=True, of=("self",)).get(pk=source.pk)
        latest = AnalysisTemplate.latest(source, name)
        if latest is not None and latest.body == body:
            return latest
        template = AnalysisTemplate.objects.create(
            source=source,
            name=name,
            version=(latest.version + 1) if latest else 1,
            body=body,
            created_by=actor.label,
            note=note,
        )
        record(
            AuditAction.ANALYSIS_TEMPLATE_SAVED,
            actor=actor,
            target=template,
            details={
                "source": source.name,
                "name": name,
                "version": template.version,
                "replaces_version": latest.version if latest else None,
                "prompts": len(body["prompts"]),
                "metrics": [m["name"] for m in body["judge"]["metrics"]],
                "note": note[:QUOTED_CHARS],
            },
        )
    return template


def templates_of(source: Source):
    """The latest version of each of `source`'s templates, by name."""
    return AnalysisTemplate.objects.filter(source=source).latest_versions().order_by("name")


def versions_of(source: Source, name: str):
    """Every version of one template, newest first."""
    return AnalysisTemplate.objects.of(source, name).order_by("-version")


def get_version(source: Source, name: str, version: int | None = None) -> AnalysisTemplate | None:
    """One version (the latest when `version` is None), or None."""
    if version is None:
        return AnalysisTemplate.latest(source, name)
    return AnalysisTemplate.objects.of(source, name).filter(version=version).first()


def spec_of(template: AnalysisTemplate) -> TemplateSpec:
    """A stored version, parsed: what a canary analysis runs with. Re-parsed rather than
    trusted, so a body stored under older limits is refused with the same field errors."""
    return parse_template(template.body)


def template_for_analysis(
    source: Source, name: str, version: int | None = None
) -> tuple[AnalysisTemplate, TemplateSpec]:
    """The version a canary analysis of `source` would run with, parsed and checked, for a
    plan to call before anything moves. Raises ValidationError on `analysis_template`, in
    words a person can act on, when there is no such template or version, or when it does not
    validate (fewer prompts than its `min_prompts` included)."""
    template = get_version(source, name, version)
    if template is None:
        which = f"version {version} of " if version is not None else ""
        raise ValidationError(
            {"analysis_template": [f"{source.name} has no {which}analysis template {name!r}"]}
        )
    try:
        spec = spec_of(template)
        require_min_prompts(spec)
    except ValidationError as exc:
        details = exc.message_dict if hasattr(exc, "error_dict") else {"template": exc.messages}
        said = "; ".join(f"{field}: {' '.join(m)}" for field, m in details.items())
        raise ValidationError(
            {"analysis_template": [f"analysis template {template} of {source.name}: {said}"]}
        ) from None
    return template, spec
