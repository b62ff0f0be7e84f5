"""The Celery worker process rides out broker restarts: Redis is killed (-9) and brought back
three times under a running worker (started as deployed: mingle, gossip and heartbeats as the
settings leave them) while it runs a task, and the worker must stay up, log no broken restart,
and run a task after each."""

from __future__ import annotations

import time
import uuid

import pytest

from controlplane.celery import app
from tests.fixtures.broker import killable_redis, point_producer_at, wait_until, worker_process
from tests.fixtures.broker_tasks import SLEEP_TASK

pytestmark = pytest.mark.celery

RESTARTS = 3
#: Long enough for the worker to see the connection go and retry at least once.
OUTAGE_SECONDS = 2.5


def _ran(log_path, task_id: str) -> bool:
    return f"[{task_id}] succeeded".encode() in log_path.read_bytes()


def _seconds_until_a_task_runs(log_path, *, timeout: float) -> float:
    """Send a harmless task, again each few seconds (a send made while the worker is still
    reconnecting may be refused or land before its queue is consumed), until one runs."""
    started = time.monotonic()
    sent: list[str] = []

    def one_ran() -> bool:
        if not sent or time.monotonic() - started > 3 * len(sent):
            task_id = uuid.uuid4().hex
            try:
                app.send_task("refresh.sync_gate_freshness", task_id=task_id)
                sent.append(task_id)
            except Exception:
                pass  # the broker is still coming back; the next poll sends again
        return any(_ran(log_path, task_id) for task_id in sent)

    wait_until(one_ran, timeout=timeout, what="a task to run on the worker")
    return round(time.monotonic() - started, 1)


@pytest.fixture
def redis_server(tmp_path):
    with killable_redis(tmp_path / "redis") as server:
        yield server


def test_worker_survives_three_redis_restarts(
    transactional_db, redis_server, tmp_path, fault_report
):
    log_path = tmp_path / "worker.log"
    recovered = []
    with (
        point_producer_at(redis_server.url),
        worker_process(redis_server.url, log_path, include="tests.fixtures.broker_tasks") as worker,
    ):
        _seconds_until_a_task_runs(log_path, timeout=20)
        for _ in range(RESTARTS):
            # A task running when Redis dies (unacked: tasks ack late) is what used to stop
            # the worker: "Unrecoverable error: AttributeError" from kombu's Redis channel.
            running = uuid.uuid4().hex
            app.send_task(SLEEP_TASK, args=(OUTAGE_SECONDS + 1,), task_id=running)
            wait_until(
                lambda task_id=running: f"[{task_id}] received".encode() in log_path.read_bytes(),
                timeout=10,
                what="the long task to start",
            )
            redis_server.kill()
            time.sleep(OUTAGE_SECONDS)  # the outage itself: nothing to poll for
            redis_server.start()
            recovered.append(_seconds_until_a_task_runs(log_path, timeout=30))
            assert worker.poll() is None, log_path.read_text()[-4000:]
    log = log_path.read_text()
    lost = log.count("Connection to broker lost")
    assert lost >= RESTARTS, log[-4000:]  # every restart was seen, and ridden out
    assert "Unrecoverable error" not in log, log[-4000:]
    # The consumer's restart used to trip over its own dropped connection in kombu: "Error on
    # restarting Gossip: AttributeError(...)" on every restart.
    assert "Error on restarting" not in log, log[-6000:]
    fault_report(
        redis_restarts=RESTARTS, worker_exits=0, connection_losses=lost, task_after_s=recovered
    )
