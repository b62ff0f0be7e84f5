"""The shared Celery worker fixture really consumes from Redis."""

import threading

import pytest
from celery import shared_task

_seen = threading.Event()


@shared_task(name="tests.mark_seen")
def mark_seen(value: int) -> None:
    if value == 42:
        _seen.set()


@pytest.mark.celery
def test_worker_consumes_a_task_from_redis(celery_worker):
    mark_seen.delay(42)
    assert _seen.wait(timeout=20), "the task never reached the worker"
