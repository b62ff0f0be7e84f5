"""Forms for sources and static workers. Validation is `fleet.validation`, shared with the
services and the command line, so every entry point rejects the same input the same way."""

from __future__ import annotations

from django import forms
from django.core.exceptions import ValidationError

from controlplane.dynamo import fingerprint as fp
from controlplane.fleet.models import FAMILY_CHOICES, AgreementRule, DriftPolicy, Source
from controlplane.fleet.validation import (
    AGREEMENT_DEFAULTS,
    DEFAULT_DRIFT_POLICY,
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
    allowed_networks = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="CIDRs, comma or newline separated, e.g. 10.0.0.0/8",
    )
    refresh_interval_seconds = forms.FloatField(initial=10.0, label="Discovery interval (s)")
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

    @classmethod
    def for_source(cls, source: Source, data=None) -> SourceForm:
        initial = {f: getattr(source, f) for f in cls.base_fields}
        initial["allowed_networks"] = "\n".join(source.allowed_networks)
        return cls(data, initial=initial)

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
