from django import forms

from controlplane.audit.actions import AuditAction


class AuditFilterForm(forms.Form):
    """History filters. Everything is optional; an invalid value is reported, not ignored."""

    action = forms.ChoiceField(choices=[("", "any action"), *AuditAction.choices], required=False)
    actor = forms.CharField(required=False, max_length=200)
    target = forms.CharField(
        required=False, max_length=300, help_text="type:id, or text in the target label"
    )
    correlation_id = forms.CharField(required=False, max_length=64)
    since = forms.DateTimeField(
        required=False, widget=forms.DateTimeInput(attrs={"type": "datetime-local"})
    )
    until = forms.DateTimeField(
        required=False, widget=forms.DateTimeInput(attrs={"type": "datetime-local"})
    )

    def clean(self):
        data = super().clean()
        if data.get("since") and data.get("until") and data["since"] > data["until"]:
            raise forms.ValidationError("“since” must be before “until”.")
        return data

    def filter(self, queryset):
        data = self.cleaned_data
        if data.get("action"):
            queryset = queryset.filter(action=data["action"])
        if data.get("actor"):
            queryset = queryset.filter(actor_label__icontains=data["actor"])
        if target := data.get("target"):
            target_type, sep, target_id = target.partition(":")
            if sep and target_id:
                queryset = queryset.filter(target_type=target_type, target_id=target_id)
            else:
                queryset = queryset.filter(target_label__icontains=target)
        if data.get("correlation_id"):
            queryset = queryset.filter(correlation_id=data["correlation_id"])
        if data.get("since"):
            queryset = queryset.filter(occurred_at__gte=data["since"])
        if data.get("until"):
            queryset = queryset.filter(occurred_at__lte=data["until"])
        return queryset
