"""Gates get a four-valued state with reasons, `since`, forced-reopen fields and the verified
instance set. Existing rows keep their meaning: an open gate becomes `open`, a closed one
`closed`; `since` starts at the last update."""

import django.utils.timezone
from django.db import migrations, models


def states_from_is_open(apps, schema_editor):
    Gate = apps.get_model("refresh", "Gate")
    Gate.objects.filter(is_open=True).update(state="open")
    Gate.objects.filter(is_open=False).update(state="closed")
    Gate.objects.update(since=models.F("updated_at"))


def is_open_from_states(apps, schema_editor):
    Gate = apps.get_model("refresh", "Gate")
    Gate.objects.update(is_open=models.Q(state__in=["open", "open_forced"]))


CHOICES = [
    ("open", "open"),
    ("open_forced", "open (forced)"),
    ("closed", "closed"),
    ("unknown", "unknown"),
]


class Migration(migrations.Migration):
    dependencies = [
        ("refresh", "0002_refresh_fingerprint"),
    ]

    operations = [
        migrations.RenameField(model_name="gate", old_name="closed_reason", new_name="reason"),
        migrations.AddField(
            model_name="gate",
            name="state",
            field=models.CharField(choices=CHOICES, default="open", max_length=16),
        ),
        migrations.AddField(
            model_name="gate",
            name="state_before_unknown",
            field=models.CharField(blank=True, choices=CHOICES, default="", max_length=16),
        ),
        migrations.AddField(
            model_name="gate",
            name="since",
            field=models.DateTimeField(default=django.utils.timezone.now),
        ),
        migrations.AddField(
            model_name="gate",
            name="forced_by",
            field=models.CharField(blank=True, max_length=200),
        ),
        migrations.AddField(
            model_name="gate",
            name="forced_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="gate",
            name="verified_instances",
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.AddField(
            model_name="gate",
            name="confirmed_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="gate",
            name="unverified_count",
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.AddField(
            model_name="gate",
            name="drift",
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.AlterField(
            model_name="gate",
            name="updated_at",
            field=models.DateTimeField(default=django.utils.timezone.now),
        ),
        migrations.RunPython(states_from_is_open, is_open_from_states),
        migrations.RemoveField(model_name="gate", name="is_open"),
    ]
