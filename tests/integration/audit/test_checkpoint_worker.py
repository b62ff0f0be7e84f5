"""The beat task, run by a real Celery worker, appends a checkpoint the verifier accepts."""

from __future__ import annotations

import pytest

from controlplane.audit.tasks import checkpoint_chain_head_task
from tests.integration.audit.conftest import record_some, verify
from tests.integration.fleet.conftest import wait_for

pytestmark = pytest.mark.celery


def test_worker_runs_the_checkpoint_task(celery_worker, audit_settings):
    path = audit_settings.AUDIT_ANCHOR_FILE
    record_some(4)
    checkpoint_chain_head_task.delay()
    wait_for(lambda: path.exists() and path.read_text().count("\n") == 1)
    record_some(1)
    checkpoint_chain_head_task.delay()
    wait_for(lambda: path.read_text().count("\n") == 2)
    ok, said = verify(path)
    assert ok and "2 signed checkpoints verified" in said
