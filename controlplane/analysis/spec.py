"""An analysis template, parsed: the held-out prompts, the judge's rules, the generation budget
and the background window after a reopen (docs/operate/canary-analysis-templates.md).

`parse_template` is the one way in. It takes the JSON a person or a program wrote (the web form,
the API's PUT, `manage.py analysis_template set`) and either returns a `TemplateSpec` or raises
a `ValidationError` keyed by the field at fault (`prompts[3].prompt`, `judge.pass_score`), so
bad input is refused whole and nothing is stored. `TemplateSpec.to_dict()` is the stored form
(`AnalysisTemplate.body`, shape `TemplateBody`) and parses back to an equal spec.

The limits below bound what one template may cost: its prompts are sent to two cohorts on every
canary analysis and kept in the database for good (versions are append-only).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, TypedDict, cast

from django.core.exceptions import ValidationError

from controlplane.analysis.catalog import CATALOG, DRIFT, OUTPUT, SERVING
from controlplane.analysis.rules import DIRECTIONS, JudgeSpec, MetricRule
from controlplane.dynamo.jsonsafe import UnsafeJSON, loads_bounded

# -- limits -------------------------------------------------------------------------------------
#: Prompts in one template: each is sent to both cohorts, so 512 is ~1,000 requests per
#: analysis, minutes on a small canary; more would hold a refresh longer than a person waits.
MAX_PROMPTS = 512
#: Token ids in one prompt plus its reference continuation: within every served model's
#: context and small enough that teacher forcing one case stays one ordinary request.
MAX_CASE_TOKENS = 4096
#: Token ids are non-negative and fit a signed 32-bit integer (every tokenizer's vocabulary
#: does); anything else is a typo or a different encoding, refused rather than sent.
TOKEN_ID_LIMIT = 2**31
#: The whole template as JSON. 512 prompts of a few hundred tokens fit; a larger body would be
#: a data set, which belongs elsewhere than in an audited, never-deleted row.
MAX_TEMPLATE_BYTES = 1024 * 1024
#: Generation budget per reply: enough for repetition and length to show, small enough that an
#: analysis of hundreds of prompts stays quick.
MAX_GENERATION_TOKENS = 256
#: Group names, like source names, are short slugs shown in tables.
MAX_GROUP_CHARS = 64

DEFAULT_MIN_PROMPTS = 20
DEFAULT_MAX_TOKENS = 16

NOTIFY = "notify"
ROLLBACK = "rollback"
FLEET_BREACH_ACTIONS = (NOTIFY, ROLLBACK)


# -- the stored form (AnalysisTemplate.body) ----------------------------------------------------
class PromptCaseJson(TypedDict):
    prompt: list[int]
    continuation: list[int] | None


class MetricRuleJson(TypedDict):
    name: str
    direction: str
    allowed_effect: float
    critical: bool
    group: str
    must_have_data: bool


class JudgeJson(TypedDict):
    metrics: list[MetricRuleJson]
    group_weights: dict[str, float]
    pass_score: float
    marginal_score: float
    alpha: float
    min_samples: int


class BackgroundJson(TypedDict):
    window_seconds: int
    interval_seconds: int
    sample_prompts: int
    max_error_rate: float
    max_latency_ratio: float
    on_fleet_breach: str


class TemplateBody(TypedDict):
    """`AnalysisTemplate.body`: what `TemplateSpec.to_dict()` writes, every key present."""

    prompts: list[PromptCaseJson]
    judge: JudgeJson
    min_prompts: int
    max_tokens: int
    background: BackgroundJson


# -- the parsed form ----------------------------------------------------------------------------
@dataclass(frozen=True)
class PromptCase:
    prompt: tuple[int, ...]
    #: The reference continuation teacher-forced under both cohorts; None: the baseline
    #: cohort's own greedy reply to the prompt is the reference.
    continuation: tuple[int, ...] | None = None


@dataclass(frozen=True)
class BackgroundSpec:
    """What the background analysis after a reopen watches, and for how long."""

    #: How long after the reopen the admitted workers keep being compared.
    window_seconds: int = 900
    #: Seconds between two comparisons within the window.
    interval_seconds: int = 60
    #: Prompts of the template sent through the admitted workers per comparison (rotating).
    sample_prompts: int = 4
    #: The absolute increase of a worker's error rate over the window before the refresh that
    #: counts as a breach (0.05: five more failed requests in a hundred).
    max_error_rate: float = 0.05
    #: Latency over the window before the refresh, as a ratio, that counts as a breach.
    max_latency_ratio: float = 1.5
    #: A breach on most of the fleet: `notify` only, or `rollback` to the previous policy.
    on_fleet_breach: str = NOTIFY


@dataclass(frozen=True)
class TemplateSpec:
    prompts: tuple[PromptCase, ...]
    judge: JudgeSpec
    #: Fewer prompts than this and the template is refused (`require_min_prompts`).
    min_prompts: int = DEFAULT_MIN_PROMPTS
    #: Generation budget (max_tokens) of each reply.
    max_tokens: int = DEFAULT_MAX_TOKENS
    background: BackgroundSpec = field(default_factory=BackgroundSpec)

    def to_dict(self) -> TemplateBody:
        j = self.judge
        b = self.background
        return {
            "prompts": [
                {
                    "prompt": list(c.prompt),
                    "continuation": None if c.continuation is None else list(c.continuation),
                }
                for c in self.prompts
            ],
            "judge": {
                "metrics": [
                    {
                        "name": m.name,
                        "direction": m.direction,
                        "allowed_effect": m.allowed_effect,
                        "critical": m.critical,
                        "group": m.group,
                        "must_have_data": m.must_have_data,
                    }
                    for m in j.metrics
                ],
                "group_weights": dict(j.group_weights),
                "pass_score": j.pass_score,
                "marginal_score": j.marginal_score,
                "alpha": j.alpha,
                "min_samples": j.min_samples,
            },
            "min_prompts": self.min_prompts,
            "max_tokens": self.max_tokens,
            "background": {
                "window_seconds": b.window_seconds,
                "interval_seconds": b.interval_seconds,
                "sample_prompts": b.sample_prompts,
                "max_error_rate": b.max_error_rate,
                "max_latency_ratio": b.max_latency_ratio,
                "on_fleet_breach": b.on_fleet_breach,
            },
        }


# -- the default judge --------------------------------------------------------------------------
#: Per catalog metric: (allowed effect in the metric's unit, critical, must have data).
#:
#: Critical means "a canary that fails this is a broken checkpoint, whatever else looks fine":
#: - drift (`ref_logprob`, `kl_estimate`): a successor a few training steps on moves the
#:   reference's log probability by hundredths of a nat per token; a wrong checkpoint, a
#:   corrupt load or the wrong tokenizer moves it by nats. Both must have data, so a frontend
#:   that cannot return prompt logprobs makes the analysis inconclusive, never a pass.
#: - output (`zero_tokens`, `non_terminal`, `bad_logprobs`): empty replies, replies cut by an
#:   error and NaN logprobs are what broken weights produce; a healthy successor has none
#:   (allowed effect 0: any significant increase fails).
#: Repetition (`distinct_2`) and length (`length_ratio`) legitimately move as a policy learns,
#: and serving metrics (`error`, `ttft_ms`, `total_ms`) measure the workers more than the
#: weights (the background analysis watches them after the reopen): they weigh in the score
#: but cannot fail the analysis alone.
_DEFAULTS: dict[str, tuple[float, bool, bool]] = {
    "ref_logprob": (0.1, True, True),
    "kl_estimate": (0.05, True, True),
    "zero_tokens": (0.0, True, False),
    "non_terminal": (0.0, True, False),
    "bad_logprobs": (0.0, True, False),
    "distinct_2": (0.1, False, False),
    "length_ratio": (0.25, False, False),
    "error": (0.0, False, False),
    "ttft_ms": (50.0, False, False),
    "total_ms": (200.0, False, False),
}
#: Drift says most about the weights, serving least (see above).
DEFAULT_GROUP_WEIGHTS: dict[str, float] = {DRIFT: 0.5, OUTPUT: 0.3, SERVING: 0.2}


def default_metrics() -> tuple[MetricRule, ...]:
    """Every catalog metric, in catalog order, with the defaults documented at `_DEFAULTS`."""
    return tuple(
        MetricRule(
            name=info.name,
            direction=info.default_direction,
            allowed_effect=_DEFAULTS[info.name][0],
            critical=_DEFAULTS[info.name][1],
            group=info.group,
            must_have_data=_DEFAULTS[info.name][2],
        )
        for info in CATALOG.values()
    )


def default_judge() -> JudgeSpec:
    return JudgeSpec(metrics=default_metrics(), group_weights=dict(DEFAULT_GROUP_WEIGHTS))


# -- parsing ------------------------------------------------------------------------------------
class _Errors:
    """Errors keyed by the path of the field at fault, raised together at the end."""

    def __init__(self) -> None:
        self.by_field: dict[str, list[str]] = {}

    def add(self, path: str, message: str) -> None:
        self.by_field.setdefault(path, []).append(message)

    def raise_any(self) -> None:
        if self.by_field:
            raise ValidationError(cast(Any, self.by_field))


_MISSING = object()


def _known_keys(raw: dict, allowed: set[str], path: str, errors: _Errors) -> None:
    for key in sorted(set(raw) - allowed, key=str):
        errors.add(f"{path}{key}", f"unknown field; expected one of {', '.join(sorted(allowed))}")


def _number(
    raw: dict,
    key: str,
    default: float,
    path: str,
    errors: _Errors,
    *,
    low: float | None = None,
    high: float | None = None,
    integer: bool = False,
) -> Any:
    """One numeric field: its value, or the default when absent; an error (and the default)
    when it is not a finite number (an integer where `integer`) within [low, high]."""
    value = raw.get(key, _MISSING)
    if value is _MISSING:
        return default
    where = f"{path}{key}"
    kinds: tuple[type, ...] = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        errors.add(where, f"must be {'an integer' if integer else 'a number'}")
        return default
    if not math.isfinite(value):
        errors.add(where, "must be a finite number")
        return default
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"between {low:g} and {high:g}" if high is not None else f"at least {low:g}"
        errors.add(where, f"must be {bounds}, got {value:g}")
        return default
    return int(value) if integer else float(value)


def _object(raw: Any, path: str, errors: _Errors) -> dict | None:
    if raw is _MISSING or raw is None:
        return {}
    if not isinstance(raw, dict):
        errors.add(path.rstrip("."), "must be an object")
        return None
    return raw


def _token_ids(value: Any, where: str, errors: _Errors, *, what: str) -> tuple[int, ...] | None:
    if not isinstance(value, list) or not value:
        errors.add(where, f"{what} must be a non-empty list of token ids")
        return None
    for i, token in enumerate(value):
        if isinstance(token, bool) or not isinstance(token, int):
            errors.add(where, f"token {i} is not an integer")
            return None
        if not 0 <= token < TOKEN_ID_LIMIT:
            errors.add(where, f"token {i} is {token}: token ids are in [0, 2**31)")
            return None
    return tuple(value)


def _prompt_case(raw: Any, path: str, errors: _Errors) -> PromptCase | None:
    if not isinstance(raw, dict):
        errors.add(path, 'must be an object {"prompt": [...], "continuation": [...] or null}')
        return None
    _known_keys(raw, {"prompt", "continuation"}, f"{path}.", errors)
    prompt = _token_ids(raw.get("prompt"), f"{path}.prompt", errors, what="prompt")
    continuation = None
    if raw.get("continuation") is not None:
        continuation = _token_ids(
            raw["continuation"], f"{path}.continuation", errors, what="continuation"
        )
        if continuation is None:
            return None
    if prompt is None:
        return None
    total = len(prompt) + len(continuation or ())
    if total > MAX_CASE_TOKENS:
        errors.add(path, f"{total} token ids in prompt and continuation; at most {MAX_CASE_TOKENS}")
        return None
    return PromptCase(prompt, continuation)


def _prompts(raw: Any, errors: _Errors, path: str = "prompts") -> tuple[PromptCase, ...]:
    if not isinstance(raw, list):
        errors.add(path, "must be a list of prompt cases")
        cases: tuple[PromptCase, ...] = ()
    elif len(raw) > MAX_PROMPTS:
        errors.add(path, f"{len(raw)} prompts; at most {MAX_PROMPTS}")
        cases = ()
    else:
        parsed = [_prompt_case(case, f"{path}[{i}]", errors) for i, case in enumerate(raw)]
        cases = tuple(c for c in parsed if c is not None)
    return cases


def _metric_rule(raw: Any, path: str, errors: _Errors) -> MetricRule | None:
    if isinstance(raw, str):
        raw = {"name": raw}  # a bare name takes the catalog's defaults
    if not isinstance(raw, dict):
        errors.add(path, "must be a metric name or an object with a name")
        return None
    fields = {"name", "direction", "allowed_effect", "critical", "group", "must_have_data"}
    _known_keys(raw, fields, f"{path}.", errors)
    name = raw.get("name")
    if not isinstance(name, str) or name not in CATALOG:
        errors.add(f"{path}.name", f"unknown metric {name!r}; known: {', '.join(CATALOG)}")
        return None
    info = CATALOG[name]
    defaults = _DEFAULTS[name]
    direction = raw.get("direction", info.default_direction)
    if direction not in DIRECTIONS:
        errors.add(f"{path}.direction", f"must be one of {', '.join(DIRECTIONS)}")
    effect = _number(raw, "allowed_effect", defaults[0], f"{path}.", errors, low=0)
    flags = {}
    for key, default in (("critical", defaults[1]), ("must_have_data", defaults[2])):
        flags[key] = raw.get(key, default)
        if not isinstance(flags[key], bool):
            errors.add(f"{path}.{key}", "must be true or false")
    group = raw.get("group", info.group)
    if not isinstance(group, str) or not group or len(group) > MAX_GROUP_CHARS:
        errors.add(f"{path}.group", f"must be a name of 1 to {MAX_GROUP_CHARS} characters")
        group = info.group
    return MetricRule(
        name=name,
        direction=direction if direction in DIRECTIONS else info.default_direction,
        allowed_effect=effect,
        critical=flags["critical"] is True,
        group=group,
        must_have_data=flags["must_have_data"] is True,
    )


def _judge(raw: Any, errors: _Errors) -> JudgeSpec:
    body = _object(raw, "judge.", errors)
    if body is None:
        return default_judge()
    fields = {"metrics", "group_weights", "pass_score", "marginal_score", "alpha", "min_samples"}
    _known_keys(body, fields, "judge.", errors)
    defaults = JudgeSpec(metrics=())
    metrics_raw = body.get("metrics", _MISSING)
    if metrics_raw is _MISSING:
        metrics = default_metrics()
    elif not isinstance(metrics_raw, list) or not metrics_raw:
        errors.add("judge.metrics", "must be a non-empty list of metrics")
        metrics = ()
    else:
        rules = [_metric_rule(m, f"judge.metrics[{i}]", errors) for i, m in enumerate(metrics_raw)]
        metrics = tuple(r for r in rules if r is not None)
        names = [r.name for r in metrics]
        for name in sorted({n for n in names if names.count(n) > 1}):
            errors.add("judge.metrics", f"metric {name!r} is named more than once")
    weights_raw = body.get("group_weights", _MISSING)
    if weights_raw is _MISSING:
        weights = {
            g: w for g, w in DEFAULT_GROUP_WEIGHTS.items() if g in {m.group for m in metrics}
        }
    else:
        weights = _group_weights(weights_raw, {m.group for m in metrics}, errors)
    pass_score = _number(body, "pass_score", defaults.pass_score, "judge.", errors, low=0, high=100)
    marginal = _number(
        body, "marginal_score", defaults.marginal_score, "judge.", errors, low=0, high=100
    )
    if marginal > pass_score:
        errors.add(
            "judge.marginal_score",
            f"must not exceed pass_score ({marginal:g} > {pass_score:g}): "
            "0 <= marginal_score <= pass_score <= 100",
        )
    alpha = _number(body, "alpha", defaults.alpha, "judge.", errors, low=0.0001, high=0.5)
    min_samples = _number(
        body,
        "min_samples",
        defaults.min_samples,
        "judge.",
        errors,
        low=2,
        high=MAX_PROMPTS,
        integer=True,
    )
    return JudgeSpec(
        metrics=metrics,
        group_weights=weights,
        pass_score=pass_score,
        marginal_score=marginal,
        alpha=alpha,
        min_samples=min_samples,
    )


def _group_weights(raw: Any, groups: set[str], errors: _Errors) -> dict[str, float]:
    if not isinstance(raw, dict):
        errors.add("judge.group_weights", "must be an object of group name to weight")
        return {}
    weights: dict[str, float] = {}
    for group in raw:
        if group not in groups:
            # A weight for a group no metric is in would be silently ignored: likely a typo.
            errors.add(
                f"judge.group_weights.{group}",
                f"no metric is in group {group!r}; groups: {', '.join(sorted(groups))}",
            )
            continue
        weights[group] = _number(raw, group, 1.0, "judge.group_weights.", errors, low=0)
    if weights and not any(weights.values()):
        errors.add("judge.group_weights", "at least one group must weigh more than 0")
    return weights


def _background(raw: Any, prompt_count: int, errors: _Errors) -> BackgroundSpec:
    body = _object(raw, "background.", errors)
    d = BackgroundSpec()
    if body is None:
        return d
    fields = set(BackgroundSpec.__dataclass_fields__)
    _known_keys(body, fields, "background.", errors)
    p = "background."
    window = _number(
        body, "window_seconds", d.window_seconds, p, errors, low=60, high=86400, integer=True
    )
    interval = _number(
        body, "interval_seconds", d.interval_seconds, p, errors, low=10, high=3600, integer=True
    )
    if interval > window:
        errors.add("background.interval_seconds", "must not exceed window_seconds")
    sample = _number(
        body, "sample_prompts", d.sample_prompts, p, errors, low=0, high=64, integer=True
    )
    if sample > prompt_count:
        errors.add(
            "background.sample_prompts",
            f"{sample} is more than the template's {prompt_count} prompts",
        )
    action = body.get("on_fleet_breach", d.on_fleet_breach)
    if action not in FLEET_BREACH_ACTIONS:
        errors.add(
            "background.on_fleet_breach", f"must be one of {', '.join(FLEET_BREACH_ACTIONS)}"
        )
        action = d.on_fleet_breach
    return BackgroundSpec(
        window_seconds=window,
        interval_seconds=interval,
        sample_prompts=sample,
        max_error_rate=_number(body, "max_error_rate", d.max_error_rate, p, errors, low=0, high=1),
        max_latency_ratio=_number(
            body, "max_latency_ratio", d.max_latency_ratio, p, errors, low=1, high=100
        ),
        on_fleet_breach=action,
    )


def template_size(raw: Any) -> int:
    """Bytes of `raw` as compact JSON: what `MAX_TEMPLATE_BYTES` bounds."""
    return len(json.dumps(raw, separators=(",", ":"), ensure_ascii=False).encode())


def parse_template(raw: Any) -> TemplateSpec:
    """Validate a template's JSON and return it parsed; ValidationError keyed by field path.

    Absent fields take their defaults (`judge` absent: `default_judge()`); unknown fields are
    refused, so a misspelt key is an error rather than a silently ignored setting.
    """
    if not isinstance(raw, dict):
        raise ValidationError({"template": ["must be a JSON object"]})
    try:
        size = template_size(raw)
    except (TypeError, ValueError) as exc:
        raise ValidationError({"template": [f"is not JSON: {exc}"]}) from None
    if size > MAX_TEMPLATE_BYTES:
        raise ValidationError(
            {"template": [f"{size} bytes as JSON; at most {MAX_TEMPLATE_BYTES} (1 MiB)"]}
        )
    errors = _Errors()
    _known_keys(raw, set(TemplateBody.__annotations__), "", errors)
    prompts = _prompts(raw.get("prompts", []), errors)
    judge = _judge(raw.get("judge", _MISSING), errors)
    min_prompts = _number(
        raw,
        "min_prompts",
        max(DEFAULT_MIN_PROMPTS, judge.min_samples),
        "",
        errors,
        low=1,
        high=MAX_PROMPTS,
        integer=True,
    )
    if min_prompts < judge.min_samples:
        errors.add(
            "min_prompts",
            f"must be at least judge.min_samples ({min_prompts} < {judge.min_samples}): "
            "fewer prompts could never give a metric enough samples",
        )
    max_tokens = _number(
        raw,
        "max_tokens",
        DEFAULT_MAX_TOKENS,
        "",
        errors,
        low=1,
        high=MAX_GENERATION_TOKENS,
        integer=True,
    )
    background = _background(raw.get("background", _MISSING), len(prompts), errors)
    spec = TemplateSpec(prompts, judge, min_prompts, max_tokens, background)
    # Counted only when every case parsed: a count of the good ones would mislead.
    if not any(path.startswith("prompts") for path in errors.by_field):
        problem = min_prompts_problem(spec)
        if problem:
            errors.add("prompts", problem)
    errors.raise_any()
    return spec


def min_prompts_problem(spec: TemplateSpec) -> str:
    """Why `spec` has too few prompts to be judged, or "" when it has enough.

    The rule a plan checks before a canary analysis runs (`require_min_prompts`): a template
    stored before its source's needs changed is refused with the same words as a new one.
    """
    have = len(spec.prompts)
    if have < spec.min_prompts:
        return (
            f"{have} prompt{'s' if have != 1 else ''}; this template needs at least "
            f"{spec.min_prompts} (min_prompts) for the judge to have enough samples"
        )
    return ""


def require_min_prompts(spec: TemplateSpec) -> None:
    """Raise ValidationError on `prompts` when `spec` has fewer than `min_prompts` prompts."""
    problem = min_prompts_problem(spec)
    if problem:
        raise ValidationError({"prompts": [problem]})


def read_prompt_lines(text: str, *, path: str = "prompt_file") -> list[Any]:
    """A prompt file: one JSON object per line, `{"prompt": [...], "continuation": [...]}`
    (blank lines skipped). Returns the raw cases for `parse_template`; ValidationError naming
    the first line that is not JSON."""
    cases: list[Any] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            cases.append(loads_bounded(line, max_bytes=MAX_TEMPLATE_BYTES))
        except UnsafeJSON as exc:
            raise ValidationError({path: [f"line {number} is not JSON: {exc}"]}) from None
        if len(cases) > MAX_PROMPTS:
            raise ValidationError({path: [f"more than {MAX_PROMPTS} prompts"]})
    return cases
