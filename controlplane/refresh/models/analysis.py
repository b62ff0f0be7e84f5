"""A canary analysis run: the canary compared with the baseline on a template's prompts
(`phase` canary), or the watch over the admitted workers after the gate reopened (`phase`
background). The report is written once, when the run ends; the refresh's progress keeps only
its summary (`progress.CanaryAnalysisSummary`), pointing here.
"""

from __future__ import annotations

from typing import Required, TypedDict

from django.db import models

from controlplane.analysis.judge import JudgeReport, MetricVerdict
from controlplane.analysis.metrics import MovedPrompt


class AnalysisPhase(models.TextChoices):
    CANARY = "canary", "Canary"
    BACKGROUND = "background", "After reopen"


class AnalysisRunState(models.TextChoices):
    RUNNING = "running", "Running"
    DONE = "done", "Done"
    #: It could not be judged at all (no cohort answered, the template went missing): the
    #: report says why; for a canary the outcome is inconclusive and a person decides.
    FAILED = "failed", "Could not run"


class CanaryAnalysis(models.Model):
    refresh = models.ForeignKey(
        "refresh.PolicyRefresh", on_delete=models.CASCADE, related_name="analyses"
    )
    phase = models.CharField(max_length=16, choices=AnalysisPhase.choices)
    template = models.ForeignKey(
        "analysis.AnalysisTemplate", on_delete=models.PROTECT, related_name="runs"
    )
    state = models.CharField(
        max_length=16, choices=AnalysisRunState.choices, default=AnalysisRunState.RUNNING
    )
    #: pass, marginal, inconclusive or fail; empty while it runs (and for a background watch
    #: that saw no breach yet).
    outcome = models.CharField(max_length=16, blank=True, default="")
    score = models.FloatField(null=True, blank=True)
    summary = models.CharField(max_length=500, blank=True, default="")
    #: The judge's report, the cohorts, the prompts that moved most (`CanaryReport`), or the
    #: watch's ticks and breaches (`WatchReport`).
    report = models.JSONField(default=dict, blank=True)
    started_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        app_label = "refresh"
        ordering = ["id"]
        indexes = [models.Index(fields=["refresh", "phase"])]

    def __str__(self) -> str:
        return f"{self.phase} analysis #{self.pk} of policy refresh #{self.refresh_id}"


# -- the report's shape (`CanaryAnalysis.report`; registered in controlplane/jsonshapes.py) --


class CannotJudge(TypedDict):
    """The judge's part of a report when nothing could be judged (no template, no cohort)."""

    outcome: str
    score: float | None
    summary: str
    metrics: list[MetricVerdict]


class Cohorts(TypedDict):
    baseline: list[str]
    canary: list[str]


class CohortValues(TypedDict):
    """Per metric, one value per prompt (None: not observed), as the judge was given them."""

    baseline: dict[str, list[float | None]]
    canary: dict[str, list[float | None]]


class MovedWithPrompt(MovedPrompt):
    prompt_ids: list[int]


class CanaryReport(TypedDict, total=False):
    """A canary phase's report: written once, when the analysis ends."""

    judge: Required[JudgeReport | CannotJudge]
    cohorts: Required[Cohorts]
    values: CohortValues
    moved_most: list[MovedWithPrompt]
    #: The template's prompt count.
    prompts: int
    #: Why it could not be judged.
    error: str


class WatchBreach(TypedDict):
    key: str
    why: str


class WatchTick(TypedDict):
    at: str
    workers: int
    prompts: list[int]
    breaches: list[WatchBreach]
    fleet_wide: bool


class WatchReport(TypedDict, total=False):
    """The watch after a reopen: its last ticks and every breach it acted on."""

    ticks: Required[list[WatchTick]]
    breaches: Required[list[WatchBreach]]
    tick_count: int
    last_tick_at: str


AnalysisReport = CanaryReport | WatchReport
