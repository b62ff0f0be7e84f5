"""How a refresh walks its scope: all at once, in waves, or a canary first
(docs/operate/strategies.md).

A strategy is data: `parse_strategy(dict)` validates what a person, a source default or an API
gave and raises `ValidationError` with a message naming the field; `Strategy.to_dict()` is the
JSON form stored on `PolicyRefresh.strategy` and `Source.default_strategy`. Wave assignment at
plan time (`assign_waves`) is pure: it numbers each planned worker's wave from 1.

- `all_at_once`: one wave holding every worker (the gate closes for the whole refresh).
- `waves`: at most `max_unavailable` workers of each namespace are paused at a time; the rest
  keep serving the old policy and the gate lists which instances are on which version.
- `canary`: wave 1 is `canary.size` workers (or the named `canary.instances`), evaluated before
  the rest (`canary.evaluation`: `none` = the fingerprint and generation checks alone; `manual`
  = a person approves or rejects; `trainer` = the trainer answers through
  `refresh.canary.record_canary_verdict`), then the rest in waves of `max_unavailable` (all at
  once when it is not given). `canary.analysis` names the source's analysis template: the
  canary is first compared with the workers still on the old policy and judged statistically
  (pass: on to `evaluation`; marginal: a person decides; fail: rolled back).

`max_failed` is the failure budget (any strategy): how many workers may fail update or
verification, or leave or join, before the refresh holds. `pause_after` lists the waves after
which the refresh waits until a person continues it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Required, TypedDict

from django.core.exceptions import ValidationError

ALL_AT_ONCE = "all_at_once"
WAVES = "waves"
CANARY = "canary"
KINDS = (ALL_AT_ONCE, WAVES, CANARY)

#: Canary evaluations: the checks of verify alone, a person, or the trainer's verdict.
EVAL_NONE = "none"
EVAL_MANUAL = "manual"
EVAL_TRAINER = "trainer"
EVALUATIONS = (EVAL_NONE, EVAL_MANUAL, EVAL_TRAINER)
#: How long a canary waits for a verdict unless the strategy says otherwise.
DEFAULT_VERDICT_TIMEOUT_SECONDS = 3600
MAX_VERDICT_TIMEOUT_SECONDS = 7 * 24 * 3600

_KEYS = {
    "kind",
    "max_unavailable",
    "max_failed",
    "admit_as_verified",
    "pause_after",
    "canary",
}
_CANARY_KEYS = {"size", "instances", "evaluation", "timeout_seconds", "analysis"}
#: An analysis template's name: a slug, as `analysis.models.AnalysisTemplate.name` stores it.
_TEMPLATE_NAME_CHARS = 64


class CanaryJson(TypedDict, total=False):
    """`Canary.to_dict()`: a canary's size or its named instances, how it is judged and how
    long a verdict may take (seconds)."""

    evaluation: Required[str]
    timeout_seconds: Required[int]
    size: int | str
    instances: list[str]
    #: The source's analysis template (by name) that judges the canary statistically before
    #: `evaluation` is asked (docs/concepts/canary-analysis.md).
    analysis: str


class StrategyJson(TypedDict, total=False):
    """`Strategy.to_dict()`, the strategy's JSON form (`PolicyRefresh.strategy`,
    `Source.default_strategy`, `WebhookEndpoint.default_strategy`); this module owns its keys.
    Empty (`{}`) means all at once. An amount is a count or a percentage text (`"10%"`)."""

    kind: str
    max_failed: int | str
    max_unavailable: int | str
    admit_as_verified: bool
    #: Waves (numbered from 1) after which the refresh waits until continued.
    pause_after: list[int]
    canary: CanaryJson


@dataclass(frozen=True)
class Amount:
    """A count of workers, or a percentage of a total (`"10%"`)."""

    value: int
    percent: bool = False

    @classmethod
    def parse(cls, raw: Any, what: str, *, minimum: int) -> Amount:
        if isinstance(raw, bool):
            raise ValidationError(f"{what}: expected a count or a percentage such as '10%'")
        if isinstance(raw, int):
            value, percent = raw, False
        elif isinstance(raw, str) and raw.strip():
            text = raw.strip()
            percent = text.endswith("%")
            digits = text[:-1].strip() if percent else text
            if not digits.isdigit():
                raise ValidationError(
                    f"{what}: {raw!r} is neither a count nor a percentage such as '10%'"
                )
            value = int(digits)
        else:
            raise ValidationError(f"{what}: expected a count or a percentage such as '10%'")
        if value < minimum:
            raise ValidationError(f"{what}: must be at least {minimum}{'%' if percent else ''}")
        if percent and value > 100:
            raise ValidationError(f"{what}: a percentage cannot exceed 100%")
        return cls(value, percent)

    def of(self, total: int, *, at_least: int = 0) -> int:
        """The count for `total` workers: a percentage rounds down (never above the share
        asked for), but never below `at_least`."""
        count = math.floor(total * self.value / 100) if self.percent else self.value
        return max(at_least, count)

    def to_json(self) -> int | str:
        return f"{self.value}%" if self.percent else self.value

    def __str__(self) -> str:
        return str(self.to_json())


@dataclass(frozen=True)
class Canary:
    size: Amount | None = None
    #: Instance ids (decimal strings) that form the canary, instead of a size.
    instances: tuple[str, ...] = ()
    evaluation: str = EVAL_NONE
    timeout_seconds: int = DEFAULT_VERDICT_TIMEOUT_SECONDS
    #: The analysis template that judges the canary first (None: no automated analysis).
    analysis: str | None = None

    def to_dict(self) -> CanaryJson:
        out = CanaryJson(evaluation=self.evaluation, timeout_seconds=self.timeout_seconds)
        if self.analysis:
            out["analysis"] = self.analysis
        if self.instances:
            out["instances"] = list(self.instances)
        else:
            out["size"] = (self.size or Amount(1)).to_json()
        return out


@dataclass(frozen=True)
class Strategy:
    kind: str = ALL_AT_ONCE
    max_unavailable: Amount | None = None
    max_failed: Amount = field(default_factory=lambda: Amount(0))
    admit_as_verified: bool = False
    #: Waves (numbered from 1) after which the refresh waits until continued.
    pause_after: tuple[int, ...] = ()
    canary: Canary | None = None

    @property
    def staged(self) -> bool:
        """Anything but all at once: the gate keeps serving the old set while waves run."""
        return self.kind != ALL_AT_ONCE

    def to_dict(self) -> StrategyJson:
        out = StrategyJson(kind=self.kind, max_failed=self.max_failed.to_json())
        if self.max_unavailable is not None:
            out["max_unavailable"] = self.max_unavailable.to_json()
        if self.staged:
            out["admit_as_verified"] = self.admit_as_verified
        if self.pause_after:
            out["pause_after"] = list(self.pause_after)
        if self.canary is not None:
            out["canary"] = self.canary.to_dict()
        return out

    def describe(self) -> str:
        """One line for the plan summary, the refresh page and the audit log."""
        if self.kind == ALL_AT_ONCE:
            text = "all at once"
        elif self.kind == WAVES:
            text = f"waves of at most {self.max_unavailable} per namespace"
        else:
            assert self.canary is not None
            who = (
                f"{len(self.canary.instances)} named instance(s)"
                if self.canary.instances
                else f"{self.canary.size} worker(s)"
            )
            rest = (
                f"then waves of at most {self.max_unavailable} per namespace"
                if self.max_unavailable
                else "then the rest at once"
            )
            judge = {
                EVAL_NONE: "judged by the fingerprint and generation checks",
                EVAL_MANUAL: f"approved by a person within {self.canary.timeout_seconds} s",
                EVAL_TRAINER: f"judged by the trainer within {self.canary.timeout_seconds} s",
            }[self.canary.evaluation]
            if self.canary.analysis:
                judge = f"analysed with template {self.canary.analysis!r}, then {judge}"
            text = f"canary of {who} {judge}, {rest}"
        if self.staged:
            text += (
                "; verified workers join the gate wave by wave"
                if self.admit_as_verified
                else ("; the gate moves to the new version once every wave is verified")
            )
        if self.max_failed.value:
            text += f"; up to {self.max_failed} worker(s) may fail and be quarantined"
        if self.pause_after:
            text += "; waits after wave " + ", ".join(str(w) for w in self.pause_after)
        return text


DEFAULT = Strategy()


def _reject_unknown(raw: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise ValidationError(f"{where}: unknown field(s) {', '.join(unknown)}")


def _parse_canary(raw: Any) -> Canary:
    if not isinstance(raw, Mapping):
        raise ValidationError("canary: expected an object with size or instances")
    _reject_unknown(raw, _CANARY_KEYS, "canary")
    instances: tuple[str, ...] = ()
    if raw.get("instances"):
        items = raw["instances"]
        if isinstance(items, str):
            items = [i for i in items.replace(",", " ").split() if i]
        if not isinstance(items, list | tuple):
            raise ValidationError("canary.instances: expected a list of instance ids")
        ids = []
        for item in items:
            text = str(item).strip()
            if not text.isdigit():
                raise ValidationError(f"canary.instances: {item!r} is not an instance id")
            ids.append(str(int(text)))
        if len(set(ids)) != len(ids):
            raise ValidationError("canary.instances: an instance is named twice")
        instances = tuple(ids)
    size = None
    if raw.get("size") not in (None, ""):
        if instances:
            raise ValidationError("canary: give a size or named instances, not both")
        size = Amount.parse(raw["size"], "canary.size", minimum=1)
    if size is None and not instances:
        raise ValidationError("canary: give a size (count or %) or named instances")
    evaluation = raw.get("evaluation") or EVAL_NONE
    if evaluation not in EVALUATIONS:
        raise ValidationError(
            f"canary.evaluation: {evaluation!r} is not one of {', '.join(EVALUATIONS)}"
        )
    timeout = raw.get("timeout_seconds", DEFAULT_VERDICT_TIMEOUT_SECONDS)
    try:
        timeout = int(timeout)
    except (TypeError, ValueError):
        raise ValidationError("canary.timeout_seconds: expected a number of seconds") from None
    if not 1 <= timeout <= MAX_VERDICT_TIMEOUT_SECONDS:
        raise ValidationError(
            f"canary.timeout_seconds: must be between 1 and {MAX_VERDICT_TIMEOUT_SECONDS}"
        )
    return Canary(
        size=size,
        instances=instances,
        evaluation=evaluation,
        timeout_seconds=timeout,
        analysis=_parse_template_name(raw.get("analysis")),
    )


def _parse_template_name(raw: Any) -> str | None:
    """`canary.analysis`: a template name (a slug); empty means no analysis."""
    if raw in (None, ""):
        return None
    text = raw.strip() if isinstance(raw, str) else ""
    if (
        not text
        or len(text) > _TEMPLATE_NAME_CHARS
        or not all(c.isalnum() or c in "-_" for c in text)
    ):
        raise ValidationError(
            "canary.analysis: expected an analysis template's name (letters, digits, - and _)"
        )
    return text


def parse_strategy(raw: Mapping[str, Any] | None) -> Strategy:
    """Validate a strategy's JSON form (None or {} = all at once); raises ValidationError."""
    if not raw:
        return DEFAULT
    if not isinstance(raw, Mapping):
        raise ValidationError("strategy: expected an object")
    _reject_unknown(raw, _KEYS, "strategy")
    kind = raw.get("kind") or ALL_AT_ONCE
    if kind not in KINDS:
        raise ValidationError(f"strategy.kind: {kind!r} is not one of {', '.join(KINDS)}")
    max_unavailable = None
    if raw.get("max_unavailable") not in (None, ""):
        if kind == ALL_AT_ONCE:
            raise ValidationError("max_unavailable applies to waves and canary, not all_at_once")
        max_unavailable = Amount.parse(raw["max_unavailable"], "max_unavailable", minimum=1)
    elif kind == WAVES:
        raise ValidationError("waves need max_unavailable (a count or a percentage)")
    max_failed = Amount.parse(raw.get("max_failed", 0) or 0, "max_failed", minimum=0)
    admit = raw.get("admit_as_verified", False)
    if not isinstance(admit, bool):
        raise ValidationError("admit_as_verified: expected true or false")
    if admit and kind == ALL_AT_ONCE:
        raise ValidationError("admit_as_verified applies to waves and canary, not all_at_once")
    canary = None
    if kind == CANARY:
        canary = _parse_canary(raw.get("canary"))
    elif raw.get("canary"):
        raise ValidationError("canary settings need kind 'canary'")
    pause_after = _parse_pause_after(raw.get("pause_after"), kind)
    return Strategy(
        kind=kind,
        max_unavailable=max_unavailable,
        max_failed=max_failed,
        admit_as_verified=admit,
        pause_after=pause_after,
        canary=canary,
    )


def _parse_pause_after(raw: Any, kind: str) -> tuple[int, ...]:
    if raw in (None, "", []):
        return ()
    if kind == ALL_AT_ONCE:
        raise ValidationError("pause_after needs waves or a canary: all_at_once has one wave")
    if isinstance(raw, str):
        raw = [p for p in raw.replace(",", " ").split() if p]
    if not isinstance(raw, list | tuple):
        raise ValidationError("pause_after: expected a list of wave numbers")
    waves = []
    for item in raw:
        try:
            wave = int(item)
        except (TypeError, ValueError):
            raise ValidationError(f"pause_after: {item!r} is not a wave number") from None
        if wave < 1:
            raise ValidationError("pause_after: waves are numbered from 1")
        waves.append(wave)
    return tuple(sorted(set(waves)))


def stored(refresh_or_dict: Any) -> Strategy:
    """The strategy a refresh was planned with (its stored JSON form was validated then)."""
    raw = getattr(refresh_or_dict, "strategy", refresh_or_dict)
    return parse_strategy(raw or None)


# -- wave assignment -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Placed:
    """What `assign_waves` needs of one worker."""

    key: str
    namespace: str
    instance_id: str


def assign_waves(
    strategy: Strategy, workers: Sequence[Placed]
) -> tuple[dict[str, int], int, list[str]]:
    """Per worker key its wave (from 1), the number of waves, and plan blockers.

    Waves are cut per namespace, in key order: each namespace pauses at most `max_unavailable`
    of its own workers at a time (a percentage of that namespace, at least one), and wave k
    runs the k-th slice of every namespace together. A canary is wave 1: the named instances,
    or `canary.size` workers (a percentage of the whole scope, at least one) taken round-robin
    across namespaces so each namespace's serving path is exercised early.
    """
    if not workers:
        return {}, 0, []
    if strategy.kind == ALL_AT_ONCE:
        return {w.key: 1 for w in workers}, 1, []
    blockers: list[str] = []
    ordered = sorted(workers, key=lambda w: (w.namespace, w.key))
    waves: dict[str, int] = {}
    first = 1
    if strategy.kind == CANARY:
        assert strategy.canary is not None
        canary = _pick_canary(strategy.canary, ordered, blockers)
        waves.update({key: 1 for key in canary})
        first = 2
        if len(canary) == len(ordered):
            blockers.append(
                "the canary would be every worker of the scope: nothing is left after it"
            )
    rest = [w for w in ordered if w.key not in waves]
    by_namespace: dict[str, list[Placed]] = {}
    for w in rest:
        by_namespace.setdefault(w.namespace, []).append(w)
    last = first - 1
    for members in by_namespace.values():
        size = (
            strategy.max_unavailable.of(len(members), at_least=1)
            if strategy.max_unavailable
            else len(members)
        )
        for index, w in enumerate(members):
            waves[w.key] = first + index // size
            last = max(last, waves[w.key])
    count = max(last, 1)
    beyond = [p for p in strategy.pause_after if p >= count]
    if beyond:
        blockers.append(
            f"pause_after names wave(s) {', '.join(map(str, beyond))}, but the plan has "
            f"{count} wave(s): a pause after the last wave has nothing left to wait for"
        )
    return waves, count, blockers


def _pick_canary(canary: Canary, ordered: Sequence[Placed], blockers: list[str]) -> list[str]:
    if canary.instances:
        by_instance = {w.instance_id: w.key for w in ordered}
        missing = [i for i in canary.instances if i not in by_instance]
        if missing:
            blockers.append(
                f"canary instance(s) {', '.join(missing)} are not live workers of the planned scope"
            )
        return [by_instance[i] for i in canary.instances if i in by_instance]
    assert canary.size is not None
    size = min(canary.size.of(len(ordered), at_least=1), len(ordered))
    by_namespace: dict[str, list[str]] = {}
    for w in ordered:
        by_namespace.setdefault(w.namespace, []).append(w.key)
    picked: list[str] = []
    queues = [list(keys) for keys in by_namespace.values()]
    while len(picked) < size:
        for queue in queues:
            if queue and len(picked) < size:
                picked.append(queue.pop(0))
    return picked


def wave_label(strategy: Strategy, wave: int) -> str:
    if strategy.kind == CANARY and wave == 1:
        return "canary"
    return f"wave {wave}"


def instance_list(raw: Iterable[Any] | str | None) -> list[str] | None:
    """An `instances` restriction (list or comma/space separated text) as sorted decimal ids;
    None when nothing was given. Raises ValidationError on anything that is not an id."""
    if raw is None or raw == "" or raw == []:
        return None
    items = raw.replace(",", " ").split() if isinstance(raw, str) else list(raw)
    ids = set()
    for item in items:
        text = str(item).strip()
        if not text.isdigit():
            raise ValidationError(f"instances: {item!r} is not an instance id")
        ids.add(str(int(text)))
    return sorted(ids, key=int)


def rollback_strategy(strategy: Strategy) -> dict[str, Any]:
    """How a rollback of a refresh planned with `strategy` runs: all at once after an
    all-at-once refresh, otherwise in waves of the same size (a canary's rest; all of a
    namespace when it had none), with the same failure budget and no pause points."""
    if not strategy.staged:
        return {"kind": ALL_AT_ONCE, "max_failed": strategy.max_failed.to_json()}
    size = strategy.max_unavailable or Amount(100, percent=True)
    return {
        "kind": WAVES,
        "max_unavailable": size.to_json(),
        "max_failed": strategy.max_failed.to_json(),
    }
