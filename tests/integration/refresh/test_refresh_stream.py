"""The refresh stream over a real Redis channel layer: journal events reach subscribers."""

from __future__ import annotations

import asyncio
import time

import pytest
from channels.db import database_sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser
from django.db import connection

from controlplane.refresh import intents
from controlplane.refresh.executor import execute_refresh
from controlplane.refresh.routing import websocket_urlpatterns
from controlplane.refresh.step_order import WORKER_STEPS
from tests.integration.refresh.helpers import actor_for, fleet_config, make_source, plan

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("release_async_resources"),
]


def communicator(path: str, user) -> WebsocketCommunicator:
    c = WebsocketCommunicator(URLRouter(websocket_urlpatterns), path)
    c.scope["user"] = user
    return c


async def frames_until(c, predicate, timeout: float = 30.0) -> list[str]:
    deadline = time.monotonic() + timeout
    frames = []
    while True:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"no matching frame before the deadline; got {len(frames)} frames"
        frame = await c.receive_from(timeout=remaining)
        frames.append(frame)
        if predicate(frame):
            return frames


def run_and_close(refresh_id: int) -> None:
    try:
        execute_refresh(refresh_id)
    finally:
        connection.close()


@pytest.fixture
def started(simfleet_factory, operator):
    source = make_source(simfleet_factory(fleet_config(3)))
    refresh = plan(source, operator)
    intents.start_policy_refresh(refresh, actor=actor_for(operator), enqueue=False)
    return refresh


async def test_anonymous_subscriber_is_refused(started):
    for path in (f"/ws/refreshes/{started.pk}/", "/ws/refresh-banner/0/"):
        connected, code = await communicator(path, AnonymousUser()).connect()
        assert not connected and code == 4403


async def test_journal_events_reach_an_authorised_subscriber(started, viewer):
    c = communicator(f"/ws/refreshes/{started.pk}/", viewer)
    connected, _ = await c.connect()
    assert connected
    head = await c.receive_from(timeout=10)
    # A bare client (no page drawn) gets everything from the database: head, grid, journal.
    assert 'id="refresh-live" hx-swap-oob="true"' in head and 'id="refresh-journal"' in head
    grid = await c.receive_from(timeout=10)
    assert grid.startswith('<tbody id="grid-rows" hx-swap-oob="true">')
    assert grid.count('data-status="pending"') == 3 * len(WORKER_STEPS)

    # Its own thread (not the consumer's sync thread), like a Celery worker elsewhere.
    runner = asyncio.create_task(asyncio.to_thread(run_and_close, started.pk))
    frames = await frames_until(c, lambda f: 'data-state="succeeded"' in f)
    await runner
    frames += await drain(c)
    cells = [f for f in frames if 'id="cell-' in f and 'data-status="ok"' in f]
    assert cells, "no per-worker progress cell was pushed"
    assert any('hx-swap-oob="beforeend:#timeline-' in f for f in frames), [f[:90] for f in frames]
    # State changes carry the new journal calls, prepended; never a whole table again.
    calls = "".join(f for f in frames if f.startswith('<tbody hx-swap-oob="afterbegin:#journal'))
    assert "engine/update_weights_from_disk" in calls
    assert not any('id="grid-rows"' in f or 'id="refresh-journal"' in f for f in frames)
    await c.disconnect()


async def drain(c) -> list[str]:
    frames = []
    while not await c.receive_nothing(timeout=0.5):
        frames.append(await c.receive_from(timeout=1))
    return frames


async def test_reconnect_resyncs_from_the_journal(started, viewer):
    await database_sync_to_async(execute_refresh)(started.pk)
    c = communicator(f"/ws/refreshes/{started.pk}/", viewer)
    await c.connect()
    head = await c.receive_from(timeout=10)
    assert 'data-state="succeeded"' in head
    grid = await c.receive_from(timeout=10)
    assert grid.count('data-status="ok"') == 3 * 4
    await c.disconnect()
