from django import forms

from controlplane.audit.actions import AuditAction


def grouped_actions() -> list:
    """The actions under one heading per subject (`gate.*` under "gate", …), for a select
    with optgroups instead of one list of every action."""
    groups: dict[str, list[tuple[str, str]]] = {}
    for value, _label in AuditAction.choices:
        subject, _, rest = value.partition(".")
        words = subject.replace("_", " ")
        # First in each group: every action of the subject (`gate.*`).
        groups.setdefault(subject, [(f"{subject}.*", f"any {words} action")])
        groups[subject].append((value, rest.replace("_", " ") or value))
    return [("", "any action")] + [
        (subject.replace("_", " "), choices) for subject, choices in sorted(groups.items())
    ]


class AuditFilterForm(forms.Form):
    """History filters. Everything is optional; an invalid value is reported, not ignored."""

    action = forms.ChoiceField(choices=grouped_actions, required=False)
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
        if action := data.get("action"):
            if action.endswith(".*"):
                queryset = queryset.filter(action__startswith=action[:-1])
            else:
                queryset = queryset.filter(action=action)
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
