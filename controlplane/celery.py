"""The Celery app. Tasks are thin adapters over services; see each app's tasks.py."""

import logging
import os
import sys
from pathlib import Path
from typing import Any

from celery import Celery
from celery.worker.consumer import Consumer

logger = logging.getLogger(__name__)


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
    """The worker's consumer (`worker_consumer` setting), made to ride out broker restarts.

    - On a lost connection Celery collects the connection, then closes it; when a task is
      running at that moment (every task acks late here), closing its channel tries to restore
      the unacked message through the client that collecting dropped, and kombu raises
      "AttributeError: 'NoneType' object has no attribute 'hostname'": an "Unrecoverable
      error", and the worker process exits (seen with Redis killed under a running refresh).
      The connection is already given up on at that point, so the error is logged and the
      consumer goes on reconnecting. The message stays in Redis's unacked set (restored after
      the visibility timeout) or went with Redis; either way the row it acts on is the truth
      and a duplicate is harmless (leases, claims).
    - No gossip and mingle steps: worker-to-worker chatter this project never uses, whose
      stop on the same path fails too ("Error on restarting Gossip: AttributeError: 'NoneType'
      object has no attribute 'connection_errors'"). As `--without-gossip --without-mingle`,
      for every way a worker is started.
    """

    def __init__(self, *args: Any, worker_options: dict[str, Any] | None = None, **kwargs: Any):
        options = {**(worker_options or {}), "without_gossip": True, "without_mingle": True}
        super().__init__(*args, worker_options=options, **kwargs)

    def on_connection_error_after_connected(self, exc: Exception) -> None:
        try:
            super().on_connection_error_after_connected(exc)
        except AttributeError:
            logger.warning(
                "broker connection lost with a task running; its message could not be "
                "restored on close (it is redelivered or recovered from the database)",
                exc_info=True,
            )
            self.connection = None


app = Celery("controlplane")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
