"""The verify step's cross-worker agreement check, over every verified worker of the refresh.

Runs after each worker's own checks passed. Samples come from the journal (the latest
successful generation call of each worker), not from this attempt's outcomes, so a retry that
re-ran only the odd workers is still compared with everyone else. Workers are grouped by the
model their check asked for; each group is judged by the rule the refresh was planned with
(`dynamo.fingerprint`). The odd ones out get a failed verify result (so a retry re-runs them)
and a journal row saying what they generated against what the others agreed on.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db import transaction

from controlplane.dynamo.fingerprint import AgreementRule, CrossCheck, Sample, cross_check
from controlplane.dynamo.generation import completion_sample
from controlplane.refresh.models import JournalEntry, PolicyRefresh, WorkerStepResult
from controlplane.refresh.planning import GENERATION
from controlplane.refresh.step_order import StepName
from controlplane.textlimits import REASON_CHARS, URL_CHARS

AGREEMENT = "agreement"
MAX_NAMED = 5


@dataclass(frozen=True)
class AgreementOutcome:
    ok: bool
    #: One line for the step detail (ok) or the hold reason (not ok).
    summary: str


def verified_samples(
    refresh: PolicyRefresh,
    exclude: AbstractSet[int] = frozenset(),
    *,
    fresh: Mapping[int, tuple[str, Any, Any]] | None = None,
) -> dict[str, list[tuple[int, Sample]]]:
    """model → [(planned worker id, sample)] from each worker's latest passing generation.

    `exclude`: planned workers out of play (departed, or in a namespace resolved on its own).
    `fresh`: this step's passing replies as its calls decoded them (planned worker id →
    key, request, reply); they are newer than any journal row of those workers, so only the
    other workers' rows (earlier waves, earlier attempts, a dead executor's) are read back.
    """
    # Only the four columns read: a whole entry with its planned worker also decoded that
    # worker's planned calls of every step, for each of a fleet's generation rows.
    latest: dict[int, tuple[str, Any, Any]] = {}
    entries = JournalEntry.objects.filter(
        refresh=refresh, step=StepName.VERIFY, operation=GENERATION, ok=True
    ).exclude(planned_worker=None)
    if fresh:
        entries = entries.exclude(planned_worker_id__in=list(fresh))
    for worker_id, key, request_body, response_body in entries.order_by("id").values_list(
        "planned_worker_id", "planned_worker__key", "request_body", "response_body"
    ):
        latest[worker_id] = (key, request_body, response_body)
    if fresh:
        latest.update(fresh)
    by_model: dict[str, list[tuple[int, Sample]]] = {}
    for worker_id, (key, request_body, response_body) in latest.items():
        if worker_id in exclude:
            continue
        sample = completion_sample(key, response_body)
        if sample is None:
            continue
        model = str((request_body or {}).get("model", ""))
        by_model.setdefault(model, []).append((worker_id, sample))
    return by_model


def check_agreement(
    refresh: PolicyRefresh,
    lease,
    attempt: int,
    *,
    exclude: AbstractSet[int] = frozenset(),
    fresh: Mapping[int, tuple[str, Any, Any]] | None = None,
) -> AgreementOutcome:
    """Compare every verified worker of each model; journal and fail the odd ones out.
    `fresh`: this step's passing generation replies, as decoded (see `verified_samples`)."""
    rule = AgreementRule.from_dict((refresh.verification or {}).get("agreement"))
    by_model = verified_samples(refresh, exclude, fresh=fresh)
    if not by_model:
        return AgreementOutcome(True, "no generation results to cross-check")
    checks: list[tuple[str, list[tuple[int, Sample]], CrossCheck]] = []
    for model, pairs in sorted(by_model.items()):
        pairs.sort(key=lambda p: p[1].key)
        checks.append((model, pairs, cross_check([s for _, s in pairs], rule)))
    _record(refresh, lease, attempt, rule, checks)

    notes = [f"{model}: {check.detail}" for model, _, check in checks]
    odd = [(model, o) for model, _, check in checks for o in check.odd]
    if not odd:
        return AgreementOutcome(True, "; ".join(notes))
    named = "; ".join(f"{o.key}: {o.reason}" for _, o in odd[:MAX_NAMED])
    more = f" (+{len(odd) - MAX_NAMED} more)" if len(odd) > MAX_NAMED else ""
    head = next(c for _, _, c in checks if c.odd)
    kind = "no plurality" if head.ambiguous else "workers disagree"
    return AgreementOutcome(
        False,
        f"verify: {kind} on the generation check ({rule.describe()}) — {named}{more}",
    )


def _record(refresh, lease, attempt: int, rule: AgreementRule, checks) -> None:
    now = datetime.now(UTC)
    entries: list[JournalEntry] = []
    failures: list[WorkerStepResult] = []
    for model, pairs, check in checks:
        odd = {o.key: o for o in check.odd}
        # One fleet-level row per model says what was compared and what the reference was.
        entries.append(
            JournalEntry(
                refresh=refresh,
                planned_worker=None,
                step=StepName.VERIFY,
                operation=AGREEMENT,
                method="CHECK",
                url=f"cross-worker agreement on {model}"[:URL_CHARS],
                request_body={"rule": rule.to_dict(), "workers": [s.key for _, s in pairs]},
                response_body={
                    "reference_ids": list(check.reference_ids),
                    "agreeing": check.reference_size,
                    "odd": sorted(odd),
                    "ambiguous": check.ambiguous,
                },
                ok=check.ok,
                error="" if check.ok else check.detail,
                duration_ms=0.0,
                attempt=attempt,
                started_at=now,
                finished_at=now,
                lease_token=lease.token,
            )
        )
        for worker_id, sample in pairs:
            if sample.key not in odd:
                continue
            reason = f"agreement: {odd[sample.key].reason}"
            entries.append(
                JournalEntry(
                    refresh=refresh,
                    planned_worker_id=worker_id,
                    step=StepName.VERIFY,
                    operation=AGREEMENT,
                    method="CHECK",
                    url=f"cross-worker agreement on {model}"[:URL_CHARS],
                    request_body={"rule": rule.to_dict()},
                    response_body={
                        "got_ids": list(sample.ids),
                        "reference_ids": list(check.reference_ids),
                    },
                    ok=False,
                    error=reason,
                    duration_ms=0.0,
                    attempt=attempt,
                    started_at=now,
                    finished_at=now,
                    lease_token=lease.token,
                )
            )
            # Written after the worker's ok result, so it is the latest: a retry re-runs it.
            failures.append(
                WorkerStepResult(
                    refresh=refresh,
                    planned_worker_id=worker_id,
                    step=StepName.VERIFY,
                    attempt=attempt,
                    status="failed",
                    error=reason[:REASON_CHARS],
                    finished_at=now,
                )
            )
    with transaction.atomic():
        lease.guard()
        JournalEntry.objects.bulk_create(entries)
        WorkerStepResult.objects.bulk_create(failures)
