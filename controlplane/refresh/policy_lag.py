"""Policy lag: how far the policy a namespace's admitted workers serve is behind the trainer's.

Facts: `fleet.PublishedPolicy` rows, one per checkpoint a trainer announced (`checkpoint.ready`
with a `step`, or the lighter `policy.published`), written only by `publish`. Per source and
lineage (a training run; "" when the trainer names none) steps and versions only move forward:
an older step, or a version already published at another step, is refused (`NotMonotonic`).

View: `lag_of` compares the latest published policy meant for a namespace with the version(s)
its gate admits, read from the gate as the gate module serialises it (`verified_version`, and
any `versions` list a gate view publishes): steps and seconds behind, against the source's
`max_lag_steps`. The gate API, the gate pages and /metrics show it (`with_lag` adds it to a
serialised gate, `with_lags_of` to several of a source); `stale_policy.py` acts on it (the
source's `max_lag_action`).

`is_regression` is the drift rule for versions: a worker reporting a version older than the one
it was admitted at is a regression, not a new truth.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, connection, transaction
from django.db.models import CharField, Max, Q, QuerySet, Value
from django.utils import timezone

from controlplane.fleet.models import PublishedPolicy, Source

if TYPE_CHECKING:
    pass

#: Longest `version_key` (longer versions are refused by the event schemas first).
VERSION_KEY_MAX = 200


class NotMonotonic(ValueError):
    """A publication that would move a lineage backwards, or reuse a version at a new step."""


def version_key(version: Any) -> str:
    """A weight version as text: 400 and "400" are one version (trainers send either)."""
    return (version if isinstance(version, str) else str(version))[:VERSION_KEY_MAX]


@dataclass(frozen=True)
class Published:
    """What `publish` did: the row, and whether it was new (False: the same fact again)."""

    policy: PublishedPolicy
    created: bool


def publish(
    source: Source,
    *,
    step: int,
    version: Any,
    digest: str = "",
    lineage: str = "",
    namespaces: Sequence[str] = (),
    published_at: datetime | None = None,
    webhook_id: str = "",
    event_type: str,
) -> Published:
    """Record one published policy. The same (lineage, step) with the same version and digest
    again is the same fact (idempotent); anything that moves the lineage backwards raises
    `NotMonotonic` and writes nothing."""
    key = version_key(version)
    with transaction.atomic():
        # One publisher at a time per source: the monotonic check and the insert must not
        # interleave with another delivery's.
        Source.objects.select_for_update(no_key=True).filter(pk=source.pk).first()
        same_step = PublishedPolicy.objects.filter(
            source=source, lineage=lineage, step=step
        ).first()
        if same_step is not None:
            if same_step.version_key == key and same_step.digest == (digest or ""):
                return Published(same_step, False)
            raise NotMonotonic(
                f"step {step} of lineage {lineage or '(default)'} was published before as "
                f"{same_step.version_key!r} (digest {same_step.digest or 'none'})"
            )
        latest = (
            PublishedPolicy.objects.filter(source=source, lineage=lineage).order_by("-step").first()
        )
        if latest is not None and step < latest.step:
            raise NotMonotonic(
                f"step {step} is older than step {latest.step} already published for lineage "
                f"{lineage or '(default)'}"
            )
        if PublishedPolicy.objects.filter(source=source, lineage=lineage, version_key=key).exists():
            raise NotMonotonic(f"version {key!r} was published before at another step")
        try:
            with transaction.atomic():
                row = PublishedPolicy.objects.create(
                    source=source,
                    lineage=lineage,
                    step=step,
                    version=version,
                    version_key=key,
                    digest=digest or "",
                    namespaces=sorted(set(namespaces)),
                    published_at=published_at or timezone.now(),
                    webhook_id=webhook_id,
                    event_type=event_type,
                )
        except IntegrityError:  # the same step raced in from another delivery
            raise NotMonotonic(f"step {step} was published concurrently") from None
    return Published(row, True)


def is_regression(admitted: Any, reported: Any, steps: Mapping[str, int]) -> bool:
    """True when a worker admitted at `admitted` reports `reported`, an older version of the
    same lineage. `steps` maps version keys to their published steps (`steps_of`); versions
    the trainer never published cannot be ordered, so they are not called a regression here
    (they are drift of another kind: a version other than the admitted one). Pure."""
    if admitted is None or reported is None:
        return False
    was, now = steps.get(version_key(admitted)), steps.get(version_key(reported))
    return was is not None and now is not None and now < was


def steps_of(source: Source, versions: Iterable[Any], lineage: str | None = None) -> dict[str, int]:
    """The published step of each of `versions` (those published), by version key."""
    keys = {version_key(v) for v in versions if v is not None}
    rows = PublishedPolicy.objects.filter(source=source, version_key__in=keys)
    if lineage is not None:
        rows = rows.filter(lineage=lineage)
    return dict(rows.values_list("version_key", "step"))


@dataclass(frozen=True)
class Lag:
    """One namespace's lag (`steps` and `seconds` None when it cannot be measured: nothing
    admitted, or the admitted version was never published)."""

    lineage: str
    latest_step: int
    latest_version: Any
    latest_digest: str
    latest_published_at: str
    serving_version: Any
    serving_step: int | None
    steps: int | None
    seconds: float | None
    max_lag_steps: int
    action: str
    exceeded: bool

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def admitted_versions(gate: Mapping[str, Any]) -> list[Any]:
    """The versions a serialised gate stands for: its `verified_version`, and the versions of
    a `versions` list (`[{"version": ..., ...}]`) where the gate view publishes one. A closed
    gate keeps the version it admitted last, so its lag says how far behind it would reopen;
    `stale_policy` acts on admitting gates only."""
    found = [gate.get("verified_version")]
    for entry in gate.get("versions") or []:
        if isinstance(entry, Mapping):
            found.append(entry.get("version"))
    return [v for v in found if v is not None]


def _meant_for(namespace: str) -> Q:
    return Q(namespaces=[]) | Q(namespaces__contains=[namespace])


def _published_for(source: Source, namespace: str) -> QuerySet[PublishedPolicy]:
    """The source's publications meant for `namespace` (all namespaces, or naming it).

    SQLite (the embedded runtime, a demo's handful of publications) has no JSON containment
    lookup, so there the rows are matched here instead (as fleet/filters.py does for routes)."""
    published = PublishedPolicy.objects.filter(source=source)
    if connection.features.supports_json_field_contains:
        return published.filter(_meant_for(namespace))
    meant = [
        pk
        for pk, namespaces in published.values_list("pk", "namespaces")
        if not namespaces or namespace in namespaces
    ]
    return published.filter(pk__in=meant)


def lag_of(source: Source, namespace: str, gate: Mapping[str, Any]) -> Lag | None:
    """The namespace's lag; None when no policy was published for it."""
    return lags_of(source, [(namespace, gate)])[0]


def _meant(row: PublishedPolicy, namespace: str) -> bool:
    return not row.namespaces or namespace in row.namespaces


def _first_per_namespace(
    queries: Mapping[str, QuerySet[PublishedPolicy]],
) -> dict[str, PublishedPolicy]:
    """The first row of each namespace's query, all in one statement (a UNION of the
    namespaces' one-row queries, each row labelled with its namespace)."""
    parts = [
        query.annotate(for_namespace=Value(namespace, output_field=CharField()))[:1]
        for namespace, query in queries.items()
    ]
    if not parts:
        return {}
    if not connection.features.supports_slicing_ordering_in_compound:
        # SQLite (the embedded runtime, a demo's few namespaces): one query each.
        return {ns: row for ns, query in queries.items() if (row := query.first()) is not None}
    union = parts[0].union(*parts[1:], all=True) if len(parts) > 1 else parts[0]
    return {row.for_namespace: row for row in union}


def lags_of(source: Source, gates: Sequence[tuple[str, Mapping[str, Any]]]) -> list[Lag | None]:
    """The lag of each (namespace, serialised gate) of `source`, in order: at most three
    statements however many namespaces (the published rows of every admitted version, then
    one UNION for the namespaces whose admitted versions were never published, one for each
    namespace's latest step in its lineage)."""
    admitted = {namespace: admitted_versions(gate) for namespace, gate in gates}
    keys = {version_key(v) for versions in admitted.values() for v in versions}
    found = list(PublishedPolicy.objects.filter(source=source, version_key__in=keys))
    serving: dict[str, dict[str, PublishedPolicy]] = {}
    anchors: dict[str, PublishedPolicy] = {}
    for namespace, versions in admitted.items():
        wanted = {version_key(v) for v in versions}
        rows = {r.version_key: r for r in found if r.version_key in wanted and _meant(r, namespace)}
        serving[namespace] = rows
        # The lineage of what is served; else the one published to most recently.
        anchor = max(rows.values(), key=lambda r: r.step, default=None)
        if anchor is not None:
            anchors[namespace] = anchor
    anchors |= _first_per_namespace(
        {
            namespace: _published_for(source, namespace).order_by("-published_at", "-pk")
            for namespace in admitted
            if namespace not in anchors
        }
    )
    latest_of = _first_per_namespace(
        {
            namespace: _published_for(source, namespace)
            .filter(lineage=anchor.lineage)
            .order_by("-step")
            for namespace, anchor in anchors.items()
        }
    )
    out: list[Lag | None] = []
    for namespace, _ in gates:
        anchor = anchors.get(namespace)
        if anchor is None:
            out.append(None)
            continue
        out.append(
            _lag(source, admitted[namespace], serving[namespace], anchor, latest_of[namespace])
        )
    return out


def _lag(
    source: Source,
    admitted: list[Any],
    serving_rows: Mapping[str, PublishedPolicy],
    anchor: PublishedPolicy,
    latest: PublishedPolicy,
) -> Lag:
    # The worst admitted version decides: the oldest step, or an unpublished one (unknown).
    serving_version, serving_step, steps, seconds = None, None, None, None
    for version in admitted:
        row = serving_rows.get(version_key(version))
        if row is None or row.lineage != anchor.lineage:
            serving_version, serving_step, steps, seconds = version, None, None, None
            break
        behind = max(0, latest.step - row.step)
        if steps is None or behind > steps:
            serving_version, serving_step, steps = version, row.step, behind
            seconds = max(0.0, (latest.published_at - row.published_at).total_seconds())
    return Lag(
        lineage=anchor.lineage,
        latest_step=latest.step,
        latest_version=latest.version,
        latest_digest=latest.digest,
        latest_published_at=latest.published_at.isoformat(),
        serving_version=serving_version,
        serving_step=serving_step,
        steps=steps,
        seconds=seconds,
        max_lag_steps=source.max_lag_steps,
        action=source.max_lag_action,
        exceeded=steps is not None and steps > source.max_lag_steps,
    )


def policy_mark(source_id: int) -> int:
    """Moves whenever the source publishes a policy (the newest row's id; 0 for none): a gate
    copy showing lag is current only at the mark it was built at (`gate_cache`)."""
    found = PublishedPolicy.objects.filter(source_id=source_id).aggregate(mark=Max("pk"))["mark"]
    return int(found or 0)


def with_lags_of(
    source: Source, payloads: Sequence[Mapping[str, Any]], *, mark: int | None = None
) -> list[dict[str, Any]]:
    """Each serialised gate of `source` plus its `policy_lag` (None when nothing was
    published) and the `policy_mark` it was computed at: the one place that shape is built.
    One read for the mark (none when the caller read it already: `gate_lags.with_lags` reads
    every source's at once), then `lags_of`'s few, however many gates."""
    if mark is None:
        mark = policy_mark(source.pk)  # before the lag: a publication meanwhile moves the mark on
    lags = lags_of(source, [(str(p["namespace"]), p) for p in payloads])
    return [
        {**payload, "policy_lag": None if lag is None else lag.as_dict(), "policy_mark": mark}
        for payload, lag in zip(payloads, lags, strict=True)
    ]


def with_lag(payload: Mapping[str, Any], source: Source | None = None) -> dict[str, Any]:
    """A serialised gate plus its `policy_lag` and `policy_mark` (`with_lags_of` for one)."""
    if source is None:
        source = Source.objects.get(pk=payload["source_id"])
    return with_lags_of(source, [payload])[0]
