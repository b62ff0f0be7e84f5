"""What fleet tells the apps built on it, without importing them (they import fleet).

`discovery_finished` is sent once a discovery run's transaction has committed, from the
process that ran it (a Celery worker, or `manage.py discover`). Receivers must be quick and
must not raise: anything slow (pausing a drifted worker) is enqueued as its own task.

Arguments: `source_id`, `run_id`, `ok` (the listener answered and the result was stored),
`went_stale` and `recovered` (the source's stale flag changed in this run).
"""

from django.dispatch import Signal

discovery_finished = Signal()
