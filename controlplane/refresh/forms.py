"""The plan form: source, scope subset, target policy (per update method), pause modes per
family, verification."""

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


class PlanForm(forms.Form):
    source = forms.ModelChoiceField(Source.objects.filter(enabled=True), to_field_name="name")
    namespaces = forms.CharField(required=False, help_text="comma-separated; empty = all")
    worker_ids = forms.CharField(required=False, help_text="comma-separated worker ids; optional")
    weight_version = forms.CharField(max_length=200)
    method = forms.ChoiceField(choices=[(m.value, METHOD_LABELS[m]) for m in UpdateMethod])
    model_path = forms.CharField(required=False, max_length=1000)
    group_params = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))
    update_params = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))
    lora_action = forms.ChoiceField(
        required=False, choices=[(a.value, a.value) for a in LoraAction], initial=LoraAction.LOAD
    )
    lora_name = forms.CharField(required=False, max_length=200)
    lora_uri = forms.CharField(required=False, max_length=2000)
    custom_route = forms.CharField(required=False, max_length=300)
    custom_body = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))
    pause_mode = forms.ChoiceField(choices=PauseMode.choices, initial=PauseMode.AUTO)
    # Per-family overrides, each offering only its family's modes (blank: the mode above).
    pause_mode_vllm = forms.ChoiceField(required=False)
    pause_mode_vllm_sidecar = forms.ChoiceField(required=False)
    pause_mode_sglang = forms.ChoiceField(required=False)
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

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
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

    def clean(self):
        data = super().clean()
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
        }
