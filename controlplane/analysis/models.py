"""Analysis templates: per source and name, an append-only list of versions."""

from __future__ import annotations

from django.db import models

from controlplane.textlimits import LABEL_CHARS

#: A version's note: one line or a short paragraph on why it changed.
NOTE_CHARS = 500


class AnalysisTemplateQuerySet(models.QuerySet["AnalysisTemplate"]):
    def of(self, source, name: str) -> AnalysisTemplateQuerySet:
        return self.filter(source=source, name=name)

    def latest_versions(self) -> AnalysisTemplateQuerySet:
        """The newest version of each (source, name), one row each (PostgreSQL DISTINCT ON
        would tie us to one database; the subquery works on SQLite too)."""
        newest = (
            AnalysisTemplate.objects.filter(
                source=models.OuterRef("source"), name=models.OuterRef("name")
            )
            .order_by("-version")
            .values("version")[:1]
        )
        return self.filter(version=models.Subquery(newest))


class AnalysisTemplate(models.Model):
    """One version of a source's analysis template: the prompts and rules a canary analysis
    of that source runs with.

    Versions are append-only: an edit writes `version + 1` (`services.save_template`), so a
    finished analysis can always name, and show, exactly the template it ran with. `body` is
    `TemplateSpec.to_dict()` (shape `spec.TemplateBody`), validated before it is written.
    """

    source = models.ForeignKey("fleet.Source", on_delete=models.CASCADE, related_name="+")
    name = models.SlugField(max_length=64)
    version = models.PositiveIntegerField()
    #: Shape: `TemplateBody` (controlplane/analysis/spec.py).
    body = models.JSONField()
    #: Who saved this version, as the audit row names them.
    created_by = models.CharField(max_length=LABEL_CHARS, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    note = models.CharField(max_length=NOTE_CHARS, blank=True)

    objects = AnalysisTemplateQuerySet.as_manager()

    class Meta:
        ordering = ["source_id", "name", "-version"]
        constraints = [
            models.UniqueConstraint(
                fields=["source", "name", "version"], name="analysis_template_version_unique"
            ),
            models.CheckConstraint(
                condition=models.Q(version__gte=1), name="analysis_template_version_positive"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} v{self.version}"

    @classmethod
    def latest(cls, source, name: str) -> AnalysisTemplate | None:
        """The newest version of `name` on `source`, or None when it has none."""
        return cls.objects.of(source, name).order_by("-version").first()
