"""The fleet side says "discovery": a source's discovery interval, its last discovery run and its
discovery claim (before, they said "refresh", which now means only a policy refresh)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("fleet", "0011_published_policies_and_max_lag"),
    ]

    operations = [
        migrations.RenameField(
            model_name="source",
            old_name="refresh_interval_seconds",
            new_name="discovery_interval_seconds",
        ),
        migrations.RenameField(
            model_name="source",
            old_name="last_refresh_started_at",
            new_name="last_discovery_started_at",
        ),
        migrations.RenameField(
            model_name="source",
            old_name="last_refresh_finished_at",
            new_name="last_discovery_finished_at",
        ),
        migrations.RenameField(
            model_name="source",
            old_name="refresh_claimed_until",
            new_name="discovery_claimed_until",
        ),
    ]
