"""Forms for sources and static workers. Validation is `fleet.validation`, shared with the
services and the command line, so every entry point rejects the same input the same way."""

from __future__ import annotations

from django import forms
from django.core.exceptions import ValidationError

from controlplane.dynamo import fingerprint as fp
from controlplane.dynamo.families import DECLARABLE_FAMILIES
from controlplane.dynamo.releases import RELEASE_CHOICES
from controlplane.fleet.models import (
    FAMILY_CHOICES,
    AgreementRule,
    DriftPolicy,
    ListenerScope,
    MaxLagAction,
    Source,
)
from controlplane.fleet.validation import (
    AGREEMENT_DEFAULTS,
    DEFAULT_DRIFT_POLICY,
    DEFAULT_MAX_LAG_ACTION,
    DEFAULT_MAX_LAG_STEPS,
    MAX_LAG_STEPS_LIMIT,
    clean_source_values,
    clean_static_worker_values,
)


def _attach(form: forms.Form, exc: ValidationError) -> None:
    if hasattr(exc, "error_dict"):
        for field, errors in exc.message_dict.items():
            form.add_error(field if field in form.fields else None, errors)
    else:
        form.add_error(None, exc.messages)


class SourceForm(forms.Form):
    name = forms.CharField(max_length=64)
    listener_url = forms.CharField(label="RL listener URL", help_text="e.g. http://10.0.0.5:8001")
    frontend_url = forms.CharField(label="Frontend URL", required=False)
    expected_namespace = forms.CharField(required=False)
    expected_prefix = forms.CharField(required=False)
    expected_worker_suffix = forms.CharField(required=False)
    listener_scope = forms.ChoiceField(
        choices=ListenerScope.choices,
        required=False,
        label="Declared listener scope",
        help_text="which namespaces the listener is expected to report: workers outside are "
        "refused on every discovery; a global scope reaches every deployment",
    )
    allowed_networks = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="CIDRs, comma or newline separated, e.g. 10.0.0.0/8",
    )
    discovery_interval_seconds = forms.FloatField(initial=10.0, label="Discovery interval (s)")
    require_approval = forms.BooleanField(required=False)
    enabled = forms.BooleanField(required=False, initial=True)
    agreement_rule = forms.ChoiceField(
        choices=AgreementRule.choices,
        initial=AgreementRule.EXACT,
        required=False,
        label="Worker agreement rule",
        help_text="how the verify step decides that workers of one model generate alike",
    )
    agreement_tokens = forms.IntegerField(
        min_value=1,
        max_value=fp.MAX_FINGERPRINT_TOKENS,
        initial=fp.DEFAULT_AGREEMENT_TOKENS,
        required=False,
        label="Agreement tokens (k)",
        help_text="compare the first k completion tokens (short: greedy replicas can diverge "
        "at near-ties later on)",
    )
    agreement_epsilon = forms.FloatField(
        initial=fp.DEFAULT_EPSILON,
        required=False,
        label="Logprob epsilon",
        help_text="logprob rule only: largest allowed difference of a chosen token's logprob",
    )

    drift_policy = forms.ChoiceField(
        choices=DriftPolicy.choices,
        initial=DriftPolicy.QUARANTINE,
        required=False,
        label="On drift",
        help_text="what a worker that no longer matches its gate's verified policy does: "
        "quarantine (pause, catch up alone, admit back), close the gate, or only observe",
    )

    drill_every = forms.IntegerField(
        min_value=0,
        initial=0,
        required=False,
        label="Rollback drill every (h)",
        help_text="hours between scheduled rollback drills of a small canary subset; 0 = never",
    )

    declared_family = forms.ChoiceField(
        choices=[("", "from routes only"), *((f, f) for f in DECLARABLE_FAMILIES)],
        required=False,
        label="Backend family",
        help_text="declare it where routes cannot tell: native vLLM, SGLang and TRT-LLM "
        "sidecars all advertise control/* and update/*; an undeclared ambiguous worker is "
        "never paused or updated",
    )
    declared_families = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 2}),
        required=False,
        label="Backend family per namespace",
        help_text="one namespace=family per line, overriding the source's",
    )

    dynamo_release = forms.ChoiceField(
        choices=[("", "1.6.1 (default)"), *RELEASE_CHOICES],
        required=False,
        label="Dynamo release",
        help_text="the release this source's workers run; named in every refresh's "
        "compatibility record",
    )
    max_lag_action = forms.ChoiceField(
        choices=MaxLagAction.choices,
        initial=MaxLagAction.OBSERVE,
        required=False,
        label="On policy lag",
        help_text="what a namespace serving a policy more than the max lag behind the "
        "trainer's latest published one does: observe, notify, or close its gate (stale_policy)",
    )
    max_lag_steps = forms.IntegerField(
        min_value=0,
        max_value=MAX_LAG_STEPS_LIMIT,
        initial=DEFAULT_MAX_LAG_STEPS,
        required=False,
        label="Max lag (steps)",
        help_text="training steps the served policy may be behind the latest published one",
    )

    @classmethod
    def for_source(cls, source: Source, data=None) -> SourceForm:
        initial = {f: getattr(source, f) for f in cls.base_fields}
        initial["allowed_networks"] = "\n".join(source.allowed_networks)
        initial["declared_families"] = "\n".join(
            f"{ns}={family}" for ns, family in sorted((source.declared_families or {}).items())
        )
        return cls(data, initial=initial)

    def clean_declared_families(self) -> dict[str, str]:
        per_namespace: dict[str, str] = {}
        for line in (self.cleaned_data.get("declared_families") or "").splitlines():
            if not line.strip():
                continue
            namespace, sep, family = line.partition("=")
            if not sep or not namespace.strip() or not family.strip():
                raise ValidationError(f"expected namespace=family, got {line.strip()!r}")
            per_namespace[namespace.strip()] = family.strip()
        return per_namespace

    def clean(self):
        data = super().clean()
        if self.errors:
            return data
        # Left empty (or posted by a client that predates them): keep what the source has,
        # or the defaults for a new one.
        for name in AGREEMENT_DEFAULTS:
            if data.get(name) in (None, ""):
                data[name] = self.initial.get(name, AGREEMENT_DEFAULTS[name])
        if not data.get("drift_policy"):
            data["drift_policy"] = self.initial.get("drift_policy", DEFAULT_DRIFT_POLICY)
        if not data.get("max_lag_action"):
            data["max_lag_action"] = self.initial.get("max_lag_action", DEFAULT_MAX_LAG_ACTION)
        if data.get("max_lag_steps") is None:
            data["max_lag_steps"] = self.initial.get("max_lag_steps", DEFAULT_MAX_LAG_STEPS)
        if data.get("drill_every") is None:
            data["drill_every"] = self.initial.get("drill_every", 0)
        try:
            return clean_source_values(data)
        except ValidationError as exc:
            _attach(self, exc)
            return data

    def add_service_error(self, exc: ValidationError) -> None:
        _attach(self, exc)


class StaticWorkerForm(forms.Form):
    name = forms.CharField(max_length=64)
    namespace = forms.CharField()
    component = forms.CharField(initial="backend")
    endpoint = forms.CharField(
        initial="generate",
        required=False,
        help_text="the endpoint it registers with the frontend (its /health instances)",
    )
    declared_instance_id = forms.CharField(
        required=False,
        label="Declared instance id",
        help_text="only where several registered instances match: checked against the "
        "frontend's /health on every discovery",
    )
    system_url = forms.CharField(label="System URL", help_text="the worker's trusted system URL")
    family = forms.ChoiceField(choices=FAMILY_CHOICES)
    allowed_routes = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="the only engine routes ever called, comma or newline separated",
    )
    model = forms.CharField(required=False)

    def __init__(self, *args, source: Source, **kwargs):
        super().__init__(*args, **kwargs)
        self.source = source

    def clean(self):
        data = super().clean()
        if self.errors:
            return data
        try:
            return clean_static_worker_values(data, allowed_networks=self.source.allowed_networks)
        except ValidationError as exc:
            _attach(self, exc)
            return data

    def add_service_error(self, exc: ValidationError) -> None:
        _attach(self, exc)
