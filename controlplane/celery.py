"""The Celery app. Tasks are thin adapters over services; see each app's tasks.py."""

import os
import sys
from pathlib import Path
from typing import Any

from celery import Celery
from celery.worker.consumer import Consumer


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


class BrokerRestartSafeConsumer(Consumer):
    """The worker's consumer without the gossip and mingle steps (`worker_consumer` setting).

    Both exist for worker-to-worker chatter this project never uses (a worker takes tasks from
    the queue and reads everything else from the database), and both fail when the broker
    restarts: gossip's stop closes its channel through `kombu.common.ignore_errors(None, ...)`,
    "Error on restarting Gossip: AttributeError: 'NoneType' object has no attribute
    'connection_errors'" on every Redis restart. Same as `--without-gossip --without-mingle`,
    for every way a worker is started. (The AttributeError that stopped the worker itself is
    handled in the transport: controlplane/broker.py.)
    """

    def __init__(self, *args: Any, worker_options: dict[str, Any] | None = None, **kwargs: Any):
        options = {**(worker_options or {}), "without_gossip": True, "without_mingle": True}
        super().__init__(*args, worker_options=options, **kwargs)


app = Celery("controlplane")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
