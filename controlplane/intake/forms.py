"""Admin-tools forms. They parse what a person typed; the services validate the values, so the
pages, the API and tests reject the same input with the same words."""

from __future__ import annotations

import json

from django import forms
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError

from controlplane.dynamo.jsonsafe import loads_bounded
from controlplane.fleet.models import Source
from controlplane.intake.models import WebhookEndpoint, WebhookPolicy
from controlplane.intake.services.endpoints import PAUSE_MODES
from controlplane.notify.models import DestinationKind
from controlplane.notify.services import SUBSCRIBABLE


class ServiceErrorsMixin(forms.BaseForm):
    """Put a service's ValidationError next to the field it names."""

    def add_service_error(self, exc: ValidationError) -> None:
        if hasattr(exc, "error_dict"):
            for field, errors in exc.message_dict.items():
                self.add_error(field if field in self.fields else None, errors)
        else:
            self.add_error(None, exc.messages)


class TokenForm(ServiceErrorsMixin, forms.Form):
    label = forms.SlugField(max_length=64)
    user = forms.ModelChoiceField(
        queryset=get_user_model().objects.filter(is_active=True).order_by("username"),
        help_text="the token acts as this user, with this user's role; a single sign-on "
        "user's token keeps the role of its minting and lasts one session at most",
    )
    sources = forms.ModelMultipleChoiceField(
        queryset=Source.objects.order_by("name"),
        required=False,
        help_text="limit the token to these sources; none selected means every source",
    )
    expires_days = forms.IntegerField(
        required=False, min_value=1, label="Expires after (days)", help_text="empty: never"
    )


def _rules_text(rules) -> str:
    return json.dumps(rules) if rules else ""


class WebhookEndpointForm(ServiceErrorsMixin, forms.Form):
    name = forms.SlugField(max_length=64, help_text="part of the URL trainers post to")
    source = forms.ModelChoiceField(queryset=Source.objects.order_by("name"))
    namespaces = forms.CharField(
        required=False,
        help_text="comma or newline separated; empty means the source's whole scope",
        widget=forms.Textarea(attrs={"rows": 2}),
    )
    policy = forms.ChoiceField(
        choices=WebhookPolicy.choices, initial=WebhookPolicy.REQUIRE_APPROVAL
    )
    rules = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text='JSON list forcing approval, e.g. [{"metric": "eval/reward", "op": "lt", '
        '"value": 0.2}]',
    )
    pause_mode = forms.ChoiceField(choices=[(m, m) for m in PAUSE_MODES], initial="auto")
    inflight_may_straddle = forms.BooleanField(
        required=False,
        label="Requests in flight may straddle the update",
        help_text="needed by a pause mode that keeps them (keep, retract, in_place)",
    )
    default_strategy = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text='JSON strategy for the refreshes this endpoint starts, e.g. {"kind": "canary", '
        '"canary": {"size": 2, "evaluation": "trainer"}, "max_unavailable": "25%"}; empty: '
        "the source's default",
    )
    allow_strategy_override = forms.BooleanField(
        required=False,
        initial=False,
        label="Webhooks may choose their strategy",
        help_text="a checkpoint.ready naming its own strategy is refused (403) unless ticked",
    )
    enabled = forms.BooleanField(required=False, initial=True)

    @classmethod
    def for_endpoint(cls, endpoint: WebhookEndpoint, data=None) -> WebhookEndpointForm:
        initial = {f: getattr(endpoint, f) for f in cls.base_fields}
        initial["namespaces"] = "\n".join(endpoint.namespaces)
        initial["rules"] = _rules_text(endpoint.rules)
        initial["default_strategy"] = _rules_text(endpoint.default_strategy)
        return cls(data, initial=initial)

    def clean_default_strategy(self):
        text = self.cleaned_data["default_strategy"].strip()
        if not text:
            return {}
        try:
            return loads_bounded(text, max_depth=settings.JSON_MAX_DEPTH)
        except ValueError as exc:
            raise ValidationError(f"the strategy is not valid JSON: {exc}") from None

    def clean_rules(self):
        text = self.cleaned_data["rules"].strip()
        if not text:
            return []
        try:
            return loads_bounded(text, max_depth=settings.JSON_MAX_DEPTH)
        except ValueError as exc:
            raise ValidationError(f"rules are not valid JSON: {exc}") from None


class DestinationForm(ServiceErrorsMixin, forms.Form):
    name = forms.SlugField(max_length=64)
    kind = forms.ChoiceField(choices=DestinationKind.choices)
    url = forms.CharField(label="URL", max_length=500)
    allowed_networks = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="CIDRs the URL may resolve to, comma or newline separated; empty allows nothing",
    )
    events = forms.MultipleChoiceField(
        choices=[(e, e) for e in SUBSCRIBABLE],
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="none selected means every event except audit.checkpoint, which is opt-in",
    )
    source = forms.ModelChoiceField(
        queryset=Source.objects.order_by("name"),
        required=False,
        help_text="only this source's events; empty means every source",
    )
    enabled = forms.BooleanField(required=False, initial=True)

    @classmethod
    def for_destination(cls, destination, data=None) -> DestinationForm:
        initial = {f: getattr(destination, f) for f in cls.base_fields}
        initial["allowed_networks"] = "\n".join(destination.allowed_networks)
        return cls(data, initial=initial)
