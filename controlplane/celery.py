"""The Celery app. Tasks are thin adapters over services; see each app's tasks.py."""

import os
import sys
from pathlib import Path

from celery import Celery


def _started_by_celery_command(argv: list[str]) -> bool:
    """True in `celery -A controlplane worker|beat` (and `python -m celery ...`).

    The command imports this module (through `-A controlplane`) before Django's settings are
    read, so the settings can give Celery processes persistent database connections instead of
    the web process's pool (see DATABASES in settings.py). Every other process imports this
    module too, to bind `shared_task`s; they stay "web".
    """
    if not argv:
        return False
    program = Path(argv[0])
    return program.name == "celery" or program.parts[-2:] == ("celery", "__main__.py")


if _started_by_celery_command(sys.argv):
    os.environ.setdefault("CONTROLPLANE_PROCESS", "celery")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

app = Celery("controlplane")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
