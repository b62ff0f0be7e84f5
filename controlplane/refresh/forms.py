"""The plan form: source, scope subset, target policy (per update method), pause modes per
family, verification, and the strategy (blank: the source's default)."""

from __future__ import annotations

from django import forms
from django.conf import settings
from django.core.exceptions import ValidationError

from controlplane.dynamo.families import FAMILIES, LoraAction, UpdateMethod
from controlplane.dynamo.families.methods import METHOD_LABELS
from controlplane.dynamo.fingerprint import fingerprint_from_text
from controlplane.dynamo.jsonsafe import loads_bounded
from controlplane.fleet.models import Source
from controlplane.refresh.models import FlushPolicy, PauseMode
from controlplane.refresh.strategy import (
    ALL_AT_ONCE,
    CANARY,
    EVAL_MANUAL,
    EVAL_NONE,
    EVAL_TRAINER,
    MAX_VERDICT_TIMEOUT_SECONDS,
    WAVES,
    StrategyJson,
    instance_list,
    parse_strategy,
)
from controlplane.refresh.targets import family_pause_modes

#: One pause-mode field per family, offering only the modes that family has.
FAMILY_PAUSE_FIELDS = {f"pause_mode_{name.replace('-', '_')}": name for name in FAMILIES}


def _csv(value: str) -> list[str]:
    return [part.strip() for part in value.replace("\n", ",").split(",") if part.strip()]


def _json_object(value: str, name: str) -> dict:
    if not value.strip():
        return {}
    try:
        data = loads_bounded(value, max_depth=settings.JSON_MAX_DEPTH)
    except ValueError as exc:
        raise ValidationError(f"{name} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValidationError(f"{name} must be a JSON object")
    return data


def _fingerprint_field(message: str) -> str:
    """The plan form field a fingerprint validation message is about."""
    if "tolerance" in message:
        return "logprob_tolerance"
    if message.startswith(("expected tokens", "completion_token_ids")):
        return "expect_tokens"
    return "expect_logprobs"


#: Which plan form field a `parse_strategy` message is about, by the field it starts with.
_STRATEGY_FIELDS = (
    ("canary.size", "canary_size"),
    ("canary.instances", "canary_instances"),
    ("canary.evaluation", "canary_evaluation"),
    ("canary.timeout_seconds", "canary_timeout"),
    ("canary.analysis", "canary_analysis"),
    ("canary", "canary_size"),
    ("max_unavailable", "max_unavailable"),
    ("waves need max_unavailable", "max_unavailable"),
    ("max_failed", "max_failed"),
    ("admit_as_verified", "admit_as_verified"),
    ("pause_after", "pause_after"),
)


def _strategy_field(message: str) -> str:
    for prefix, field in _STRATEGY_FIELDS:
        if message.startswith(prefix):
            return field
    return "strategy_kind"


STRATEGY_KINDS = [
    (ALL_AT_ONCE, "all at once"),
    (WAVES, "waves"),
    (CANARY, "canary first, then waves"),
]


class StrategyFields(forms.Form):
    """The strategy fields, shared by the plan form and the source's default strategy form.
    A blank kind is the source's default on the plan form (and all at once for a source)."""

    # How the refresh walks its scope (refresh.strategy); blank kind: the source's default.
    strategy_kind = forms.ChoiceField(
        required=False,
        label="Strategy",
        choices=[("", "the source's default"), *STRATEGY_KINDS],
    )
    max_unavailable = forms.CharField(
        required=False,
        max_length=8,
        label="Max unavailable per namespace",
        help_text="waves and canary: a count or a percentage such as 10%",
    )
    max_failed = forms.CharField(
        required=False,
        max_length=8,
        label="Failure budget",
        help_text="workers that may fail and be quarantined before it holds (count or %)",
    )
    admit_as_verified = forms.BooleanField(
        required=False, label="Admit verified workers to the gate wave by wave"
    )
    pause_after = forms.CharField(
        required=False,
        max_length=200,
        label="Pause after waves",
        help_text="comma-separated wave numbers; the refresh waits there until continued",
    )
    canary_size = forms.CharField(
        required=False, max_length=8, label="Canary size", help_text="a count or a percentage"
    )
    canary_instances = forms.CharField(
        required=False,
        max_length=4000,
        label="Canary instances",
        help_text="comma-separated instance ids, instead of a size",
    )
    canary_evaluation = forms.ChoiceField(
        required=False,
        label="Canary judged by",
        choices=[
            (EVAL_NONE, "the fingerprint and generation checks"),
            (EVAL_MANUAL, "a person (approve or reject)"),
            (EVAL_TRAINER, "the trainer's verdict (webhook or API)"),
        ],
    )
    canary_timeout = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=MAX_VERDICT_TIMEOUT_SECONDS,
        label="Verdict timeout (s)",
        help_text="no verdict by then: the canary is rolled back",
    )
    canary_analysis = forms.CharField(
        required=False,
        max_length=64,
        label="Canary analysis template",
        help_text="judge the canary against the baseline with this template of the source first",
    )

    def _strategy(self, data) -> StrategyJson | None:
        """The strategy's JSON form, None for the source's default; errors go to the field
        `parse_strategy` names."""
        kind = data.get("strategy_kind") or ""
        canary = {
            "size": data.get("canary_size") or None,
            "instances": data.get("canary_instances") or None,
            "evaluation": data.get("canary_evaluation") or None,
            "timeout_seconds": data.get("canary_timeout"),
            "analysis": data.get("canary_analysis") or None,
        }
        canary = {k: v for k, v in canary.items() if v not in (None, "")}
        raw = {
            "max_unavailable": data.get("max_unavailable") or None,
            "max_failed": data.get("max_failed") or None,
            "admit_as_verified": bool(data.get("admit_as_verified")),
            "pause_after": data.get("pause_after") or None,
        }
        raw = {k: v for k, v in raw.items() if v not in (None, False)}
        if kind == CANARY:
            raw["canary"] = canary
        elif set(canary) - {"evaluation"}:
            self.add_error("strategy_kind", "canary settings need the canary strategy")
            return None
        if not kind:
            if raw:
                self.add_error("strategy_kind", "choose a strategy for these settings")
            return None
        try:
            return parse_strategy({"kind": kind, **raw}).to_dict()
        except ValidationError as exc:
            for message in exc.messages:
                self.add_error(_strategy_field(message), message)
            return None


class PlanForm(StrategyFields):
    source = forms.ModelChoiceField(Source.objects.filter(enabled=True), to_field_name="name")
    namespaces = forms.CharField(required=False, help_text="comma-separated; empty = all")
    worker_ids = forms.CharField(required=False, help_text="comma-separated worker ids; optional")
    weight_version = forms.CharField(max_length=200)
    method = forms.ChoiceField(
        choices=[(m.value, METHOD_LABELS[m]) for m in UpdateMethod],
        widget=forms.Select(attrs={"data-method-select": ""}),
    )
    model_path = forms.CharField(required=False, max_length=1000)
    group_params = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))
    update_params = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))
    lora_action = forms.ChoiceField(
        required=False, choices=[(a.value, a.value) for a in LoraAction], initial=LoraAction.LOAD
    )
    lora_name = forms.CharField(required=False, max_length=200)
    lora_uri = forms.CharField(required=False, max_length=2000)
    apply_timeout_s = forms.FloatField(
        required=False,
        min_value=0.1,
        max_value=86400,
        label="Apply timeout (s)",
        help_text="external: how long the paused workers wait for the trainer's applied report",
    )
    custom_route = forms.CharField(required=False, max_length=300)
    custom_body = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))
    pause_mode = forms.ChoiceField(choices=PauseMode.choices, initial=PauseMode.AUTO)
    # Per-family overrides, each offering only its family's modes (blank: the mode above).
    pause_mode_vllm = forms.ChoiceField(required=False)
    pause_mode_vllm_sidecar = forms.ChoiceField(required=False)
    pause_mode_sglang = forms.ChoiceField(required=False)
    inflight_may_straddle = forms.BooleanField(
        required=False,
        label="Requests in flight may straddle the update",
        help_text="needed by a pause mode that keeps them (keep, retract, in_place): they "
        "continue on the new weights, and the serving ledger marks the window as mixed",
    )
    flush_policy = forms.ChoiceField(choices=FlushPolicy.choices, initial=FlushPolicy.AUTO)
    version_readback = forms.BooleanField(required=False, initial=True)
    liveness = forms.BooleanField(required=False, initial=True)
    generation = forms.BooleanField(required=False, initial=True)
    prompt_token_ids = forms.CharField(required=False, initial="5, 6, 7, 8")
    max_tokens = forms.IntegerField(min_value=1, max_value=64, initial=4)
    expected_model = forms.CharField(required=False, max_length=300)
    # The trainer's fingerprint of the new policy on the verification prompt (optional).
    expect_tokens = forms.CharField(
        required=False,
        max_length=4096,
        label="Expected completion token ids",
        help_text="comma-separated; every worker must generate exactly these first",
    )
    expect_logprobs = forms.CharField(
        required=False,
        max_length=8192,
        label="Reference logprobs",
        help_text="comma-separated chosen-token logprobs, compared within the tolerance",
    )
    logprob_tolerance = forms.FloatField(required=False, min_value=0, label="Logprob tolerance")
    instances = forms.CharField(
        required=False,
        max_length=4000,
        label="Only these instances",
        help_text="comma-separated instance ids; the rest keep serving and stay verified",
    )

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if not self.is_bound and not self.initial.get("source"):
            # The only source is the one meant: no choice to make, so none to forget.
            only = list(Source.objects.filter(enabled=True).values_list("name", flat=True)[:2])
            if len(only) == 1:
                self.initial["source"] = only[0]
        for field, family in FAMILY_PAUSE_FIELDS.items():
            modes = family_pause_modes(FAMILIES[family])
            choice = self.fields[field]
            assert isinstance(choice, forms.ChoiceField)
            choice.choices = [("", "as above"), *((m, m) for m in modes)]
            choice.label = f"Pause mode for {family}"

    def clean_worker_ids(self) -> list[int]:
        try:
            return [int(part) for part in _csv(self.cleaned_data["worker_ids"])]
        except ValueError:
            raise ValidationError("worker ids are numbers") from None

    def clean_prompt_token_ids(self) -> list[int]:
        try:
            return [int(part) for part in _csv(self.cleaned_data["prompt_token_ids"])]
        except ValueError:
            raise ValidationError("prompt token ids are integers") from None

    def clean_instances(self) -> list[str] | None:
        try:
            return instance_list(self.cleaned_data["instances"])
        except ValidationError as exc:
            raise ValidationError(exc.messages) from None

    def clean(self):
        data = super().clean()
        data["strategy"] = self._strategy(data)
        if data.get("method") == "disk" and not data.get("model_path"):
            self.add_error("model_path", "a disk update needs a model path")
        if data.get("method") == UpdateMethod.LORA and not data.get("lora_name"):
            self.add_error("lora_name", "a LoRA update needs the adapter's name")
        if data.get("method") == UpdateMethod.CUSTOM and not data.get("custom_route"):
            self.add_error("custom_route", "a custom update needs an allowlisted route")
        for name in ("group_params", "update_params", "custom_body"):
            try:
                data[name] = _json_object(data.get(name) or "", name.replace("_", " "))
            except ValidationError as exc:
                self.add_error(name, exc)
        if data.get("generation") and not data.get("prompt_token_ids"):
            self.add_error("prompt_token_ids", "the generation check needs prompt token ids")
        try:
            data["fingerprint"] = fingerprint_from_text(
                data.get("expect_tokens") or "",
                data.get("expect_logprobs") or "",
                data.get("logprob_tolerance"),
            )
        except ValueError as exc:
            self.add_error(_fingerprint_field(str(exc)), str(exc))
        else:
            if data["fingerprint"] and not data.get("generation"):
                self.add_error("generation", "a fingerprint needs the generation check")
        return data

    def plan_kwargs(self) -> dict:
        data = self.cleaned_data
        method = data["method"]
        target = {"weight_version": data["weight_version"], "method": method}
        if method == UpdateMethod.DISK:
            target["model_path"] = data["model_path"]
        elif method == UpdateMethod.DISTRIBUTED:
            target |= {"group": data["group_params"], "update": data["update_params"]}
        elif method == UpdateMethod.TENSOR:
            target["update"] = data["update_params"]
        elif method == UpdateMethod.EXTERNAL:
            if data.get("apply_timeout_s"):
                target["apply_timeout_s"] = data["apply_timeout_s"]
        elif method == UpdateMethod.LORA:
            target["lora"] = {
                "action": data["lora_action"] or LoraAction.LOAD,
                "lora_name": data["lora_name"],
                "uri": data["lora_uri"] or None,
            }
        else:
            target |= {"route": data["custom_route"], "body": data["custom_body"]}
        return {
            "source": data["source"],
            "target": target,
            "namespaces": _csv(data["namespaces"]) or None,
            "worker_ids": data["worker_ids"] or None,
            "pause_mode": data["pause_mode"],
            "pause_modes": {
                family: data[field] for field, family in FAMILY_PAUSE_FIELDS.items() if data[field]
            },
            "inflight_may_straddle": bool(data.get("inflight_may_straddle")),
            "flush_policy": data["flush_policy"],
            "verification": {
                "version_readback": data["version_readback"],
                "liveness": data["liveness"],
                "generation": data["generation"],
                "prompt_token_ids": data["prompt_token_ids"],
                "max_tokens": data["max_tokens"],
                "expected_model": data["expected_model"],
            },
            "fingerprint": data.get("fingerprint"),
            "strategy": data.get("strategy"),
            "instances": data.get("instances"),
        }


#: The plan form's fields that belong to some update methods only, grouped by the methods that
#: use them: the page shows the groups of the chosen method (static/js/app.js switches them).
METHOD_FIELDS: tuple[tuple[tuple[UpdateMethod, ...], tuple[str, ...]], ...] = (
    ((UpdateMethod.DISK,), ("model_path",)),
    ((UpdateMethod.DISTRIBUTED,), ("group_params",)),
    ((UpdateMethod.DISTRIBUTED, UpdateMethod.TENSOR), ("update_params",)),
    ((UpdateMethod.LORA,), ("lora_action", "lora_name", "lora_uri")),
    ((UpdateMethod.EXTERNAL,), ("apply_timeout_s",)),
    ((UpdateMethod.CUSTOM,), ("custom_route", "custom_body")),
)

#: What each method-specific field is called on the page.
METHOD_FIELD_LABELS = {
    "model_path": "Model path",
    "group_params": "Group parameters (JSON)",
    "update_params": "Update parameters (JSON)",
    "lora_action": "LoRA action",
    "lora_name": "LoRA adapter name",
    "lora_uri": "LoRA source URI (load, swap)",
    "custom_route": "Custom route (allowlisted on static workers)",
    "custom_body": "Custom route body (JSON)",
}


def method_field_groups(form: PlanForm) -> list[dict]:
    """The method-specific fields, grouped, each group marked shown or hidden by the method
    the form holds (posted, or its initial: disk). Every field is in one group only, so a
    hidden group's empty fields never shadow a shown one's values."""
    chosen = (form.data.get("method") if form.is_bound else None) or (
        form.initial.get("method") or UpdateMethod.DISK
    )
    groups = []
    for methods, names in METHOD_FIELDS:
        fields = []
        for name in names:
            bound = form[name]
            bound.label = METHOD_FIELD_LABELS.get(name, bound.label)
            fields.append(bound)
        groups.append(
            {
                "methods": " ".join(m.value for m in methods),
                "fields": fields,
                "shown": chosen in methods,
            }
        )
    return groups


class RollbackForm(forms.Form):
    """Roll back: any earlier verified version of the source (its revision history) and the
    namespaces to take back. Force-reopened namespaces start unticked: an approver opened
    them on purpose, so the operator must choose them explicitly."""

    version = forms.ChoiceField(widget=forms.RadioSelect, label="Roll back to")
    namespaces = forms.MultipleChoiceField(widget=forms.CheckboxSelectMultiple, label="Namespaces")

    def __init__(self, data=None, *, revisions, namespaces, initial=None) -> None:
        super().__init__(data, initial=initial)
        version = self.fields["version"]
        chosen = self.fields["namespaces"]
        assert isinstance(version, forms.ChoiceField)
        assert isinstance(chosen, forms.MultipleChoiceField)
        version.choices = [(r.key, r.label) for r in revisions]
        chosen.choices = [(ns.namespace, ns.namespace) for ns in namespaces]


class SourceStrategyForm(StrategyFields):
    """A source's default strategy: the same fields as the plan form's, and no "default"."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        kind = self.fields["strategy_kind"]
        assert isinstance(kind, forms.ChoiceField)
        kind.required = True
        kind.choices = STRATEGY_KINDS

    @classmethod
    def for_source(cls, source: Source, data=None) -> SourceStrategyForm:
        return cls(data, initial=strategy_initial(source.default_strategy or {}))

    def clean(self):
        data = super().clean()
        data["strategy"] = self._strategy(data)
        return data


def strategy_initial(strategy: dict) -> dict:
    """A stored strategy as the strategy fields' initial values."""
    canary = strategy.get("canary") or {}
    return {
        "strategy_kind": strategy.get("kind") or ALL_AT_ONCE,
        "max_unavailable": strategy.get("max_unavailable", ""),
        "max_failed": strategy.get("max_failed") or "",
        "admit_as_verified": bool(strategy.get("admit_as_verified")),
        "pause_after": ", ".join(str(w) for w in strategy.get("pause_after") or []),
        "canary_size": canary.get("size", ""),
        "canary_instances": ", ".join(canary.get("instances") or []),
        "canary_evaluation": canary.get("evaluation", EVAL_NONE),
        "canary_timeout": canary.get("timeout_seconds"),
        "canary_analysis": canary.get("analysis", ""),
    }
