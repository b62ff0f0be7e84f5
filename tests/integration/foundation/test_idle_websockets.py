"""Live pages keep their websocket while nothing happens.

Real Daphne, real Redis channel layer, real browser-style sockets (session cookie). The failure
this guards against: channels-redis waits for a consumer's next message with a 5 s blocking
BZPOPMIN, redis-py's default 5 s socket read timeout fired first, the consumer died with
`redis.exceptions.TimeoutError` and the page reconnected — re-sending its whole resync — every
~6 s. Idleness is the behaviour under test, so the test waits through it (once, for both
sockets at the same time), a little longer than one failure period.
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from channels.db import database_sync_to_async
from django.conf import settings
from django.test import Client

from controlplane.fleet import live
from controlplane.realtime import publish
from controlplane.refresh.live import refresh_group
from controlplane.refresh.presenters import GridFilter, seen_marks, stream_query
from tests.integration.refresh.helpers import fleet_config, make_source, plan

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("release_async_resources"),
]

#: Longer than the old failure period (5 s wait + 5 s read timeout raced; the read lost at ~5 s).
IDLE_SECONDS = 8.0


@pytest.fixture
def planned_refresh(simfleet_factory, operator):
    return plan(make_source(simfleet_factory(fleet_config(3))), operator)


@pytest.fixture
def viewer_cookie(viewer) -> str:
    client = Client()
    client.force_login(viewer)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"


async def _still_open_after_idling(ws: aiohttp.ClientWebSocketResponse) -> None:
    try:
        message = await ws.receive(timeout=IDLE_SECONDS)
    except TimeoutError:
        return  # nothing arrived and nothing closed: what an idle page should see
    pytest.fail(f"socket did not stay idle: {message.type.name} {str(message.data)[:200]!r}")


async def _next_frame(ws: aiohttp.ClientWebSocketResponse) -> str:
    message = await ws.receive(timeout=15)
    assert message.type == aiohttp.WSMsgType.TEXT, (message.type.name, message.data)
    return message.data


async def test_idle_refresh_and_fleet_sockets_stay_up_and_still_receive(
    live_server_url, planned_refresh, viewer_cookie
):
    ws_base = live_server_url.replace("http://", "ws://")
    # What the refresh page connects with: its grid page and what it already shows, so a
    # (re)connect resends only what changed since (here: nothing, so the head alone).
    marks = await database_sync_to_async(seen_marks)(planned_refresh)
    drawn = stream_query(GridFilter(), marks)
    paths = {
        "refresh": f"/ws/refreshes/{planned_refresh.pk}/?{drawn}",
        "fleet": "/ws/fleet/",
    }
    async with aiohttp.ClientSession(headers={"Cookie": viewer_cookie}) as http:
        sockets = {
            name: await http.ws_connect(f"{ws_base}{path}", autoping=True)
            for name, path in paths.items()
        }
        try:
            # The resync each (re)connect costs, for the record.
            resync = {name: await _next_frame(ws) for name, ws in sockets.items()}
            assert 'id="refresh-live"' in resync["refresh"]
            print(
                "\nresync on connect: "
                + ", ".join(f"{name} {len(frame.encode()):,} B" for name, frame in resync.items())
            )

            await asyncio.gather(*(_still_open_after_idling(ws) for ws in sockets.values()))

            # Still subscribed: an event published now (as a Celery task would) arrives.
            await asyncio.to_thread(
                publish, refresh_group(planned_refresh.pk), "state", {"state": "running"}
            )
            await asyncio.to_thread(publish, live.FLEET_GROUP, live.EVENT_SOURCES_CHANGED, {})
            refresh_frame = await _next_frame(sockets["refresh"])
            fleet_frame = await _next_frame(sockets["fleet"])
            assert 'id="refresh-live"' in refresh_frame
            assert fleet_frame.strip()
            assert all(not ws.closed for ws in sockets.values())
        finally:
            for ws in sockets.values():
                await ws.close()
