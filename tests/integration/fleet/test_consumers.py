"""The live fleet streams over a real Redis channel layer."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser

from controlplane.fleet.discovery import refresh_source
from controlplane.fleet.models import DiscoveryTrigger, Worker
from controlplane.fleet.routing import websocket_urlpatterns

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("release_async_resources"),
]


def _communicator(path: str, user) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(URLRouter(websocket_urlpatterns), path)
    communicator.scope["user"] = user
    return communicator


async def _receive_until(communicator, predicate, timeout: float = 15.0) -> str:
    """Frames until one satisfies `predicate` (each receive has its own deadline)."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        assert remaining > 0, "no matching frame before the deadline"
        frame = await communicator.receive_from(timeout=remaining)
        if predicate(frame):
            return frame


@pytest.fixture
def prefilled(simfleet, make_source):
    source = make_source(simfleet)
    refresh_source(source.pk, trigger=DiscoveryTrigger.MANUAL)
    return source


async def test_anonymous_socket_is_refused(prefilled):
    communicator = _communicator(f"/ws/fleet/sources/{prefilled.pk}/", AnonymousUser())
    connected, code = await communicator.connect()
    assert not connected and code == 4403


async def test_user_without_view_permission_is_refused(prefilled, django_user_model):
    nobody = await database_sync_to_async(django_user_model.objects.create_user)("nobody", "x")
    for path in ("/ws/fleet/", f"/ws/fleet/sources/{prefilled.pk}/"):
        connected, code = await _communicator(path, nobody).connect()
        assert not connected and code == 4403


async def test_unknown_source_is_refused(prefilled, viewer):
    connected, _ = await _communicator("/ws/fleet/sources/999999/", viewer).connect()
    assert not connected


async def test_viewer_gets_a_resync_then_only_the_changed_row(prefilled, viewer, simfleet):
    communicator = _communicator(f"/ws/fleet/sources/{prefilled.pk}/", viewer)
    connected, _ = await communicator.connect()
    assert connected
    header = await communicator.receive_from(timeout=10)
    assert 'id="source-summary" hx-swap-oob="true"' in header
    table = await communicator.receive_from(timeout=10)
    assert table.startswith('<tbody id="worker-rows" hx-swap-oob="true">')
    assert table.count('<tr id="worker-') == 4

    victim = simfleet.workers()[0]["instance_id"]
    simfleet.set_version(victim, "v42")
    await database_sync_to_async(refresh_source)(prefilled.pk, trigger=DiscoveryTrigger.MANUAL)

    frame = await _receive_until(communicator, lambda f: f.startswith("<tr "))
    worker = await database_sync_to_async(Worker.objects.get)(instance_id=str(victim))
    assert frame.startswith(f'<tr hx-swap-oob="true" id="worker-{worker.pk}"')
    assert "v42" in frame
    assert frame.count("<tr ") == 1  # only the changed row is pushed
    await communicator.disconnect()


async def test_new_worker_is_appended_and_filtered_out_rows_are_not_sent(
    prefilled, viewer, simfleet
):
    from controlplane.simfleet import WorkerSpec

    communicator = _communicator(f"/ws/fleet/sources/{prefilled.pk}/?namespace=rl-a", viewer)
    assert (await communicator.connect())[0]
    await communicator.receive_from(timeout=10)  # summary and timeline
    table = await communicator.receive_from(timeout=10)
    assert table.count('<tr id="worker-') == 2

    simfleet.add_worker(WorkerSpec(namespace="rl-a", version="fresh"))
    simfleet.add_worker(WorkerSpec(namespace="rl-b", version="other"))
    await database_sync_to_async(refresh_source)(prefilled.pk, trigger=DiscoveryTrigger.MANUAL)

    rows = await _receive_until(communicator, lambda f: f.startswith("<tbody "))
    assert rows.startswith('<tbody hx-swap-oob="beforeend:#worker-rows">')
    assert rows.count("<tr ") == 1  # the rl-b newcomer is outside this client's filter
    assert "fresh" in rows and "other" not in rows
    await communicator.disconnect()


async def test_overview_stream_pushes_the_refreshed_source_card(prefilled, viewer, simfleet):
    communicator = _communicator("/ws/fleet/", viewer)
    assert (await communicator.connect())[0]
    first = await communicator.receive_from(timeout=10)
    assert f'id="source-card-{prefilled.pk}"' in first

    simfleet.remove_worker(simfleet.workers()[0]["instance_id"])
    await database_sync_to_async(refresh_source)(prefilled.pk, trigger=DiscoveryTrigger.MANUAL)
    frame = await _receive_until(communicator, lambda f: "1 gone" in f)
    assert 'hx-swap-oob="true"' in frame and "3 live" in frame
    await communicator.disconnect()
