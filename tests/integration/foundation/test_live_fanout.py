"""The process-level fan-out of live streams, over the real Redis pub/sub channel layer.

One subscription per process per stream however many sockets listen, gone when the last one
leaves; a token limited to one source never gets another source's frames; events that arrive
while a subscriber resyncs follow its resync in order; and under uvicorn (production's server,
where frames are written to the sockets directly) a client that stops reading is cut off while
the others, one with permessage-deflate negotiated, get every frame in order.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import threading
import time
import uuid

import pytest
import redis
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.db.models import F
from django.test import Client

from controlplane import realtime
from controlplane.accounts.tokens import create_token
from controlplane.audit.recorder import Actor
from controlplane.fleet import live
from controlplane.fleet.models import Source
from controlplane.realtime import fanout
from controlplane.refresh.live import GATES_GROUP
from controlplane.refresh.models import Gate
from tests.fixtures.live_server import asgi_server

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("release_async_resources"),
]

DEADLINE_SECONDS = 20.0


def _numsub(group: str) -> int:
    channel = get_channel_layer()._get_layer()._get_group_channel_name(group)
    client = redis.Redis.from_url(os.environ["REDIS_URL"])
    try:
        return dict(client.pubsub_numsub(channel)).get(channel.encode(), 0)
    finally:
        client.close()


async def _until(condition, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_SECONDS
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        await asyncio.sleep(0.02)


def _echo_stream(group: str, gate: threading.Event | None = None) -> type[realtime.LiveStream]:
    class Echo(realtime.LiveStream):
        groups_to_join = (group,)

        def resync(self) -> list[str]:
            if gate is not None:
                assert gate.wait(DEADLINE_SECONDS), "the test never let the resync finish"
            return [json.dumps({"resync": True})]

        def render(self, event: str, payload: dict) -> list[str]:
            return [json.dumps({"event": event, **payload})]

    return Echo


async def _open(consumer, user, *, resync: bool = True) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(consumer.as_asgi(), "/ws/test/")
    communicator.scope["user"] = user
    connected, _ = await communicator.connect(timeout=10)
    assert connected
    if resync:
        assert json.loads(await communicator.receive_from(timeout=10)) == {"resync": True}
    return communicator


async def test_many_sockets_share_one_subscription_which_ends_with_the_last_of_them(viewer):
    group = f"test-fanout-{uuid.uuid4().hex[:10]}"
    stream = _echo_stream(group)
    sockets = [await _open(stream, viewer) for _ in range(5)]
    await _until(lambda: _numsub(group) == 1, "the process subscribed to the group")
    assert len(fanout.process_fanout().feeds[group].subscribers) == 5

    await asyncio.to_thread(realtime.publish, group, "step", {"n": 1})
    for s in sockets:
        assert json.loads(await s.receive_from(timeout=10)) == {"event": "step", "n": 1}

    for s in sockets[:4]:
        await s.disconnect()
    assert _numsub(group) == 1 and len(fanout.process_fanout().feeds[group].subscribers) == 1
    await sockets[4].disconnect()
    assert group not in fanout.process_fanout().feeds
    await _until(lambda: _numsub(group) == 0, "the process unsubscribed from the group")


async def test_a_refused_socket_never_joins_a_feed(db):
    group = f"test-fanout-{uuid.uuid4().hex[:10]}"
    communicator = WebsocketCommunicator(_echo_stream(group).as_asgi(), "/ws/test/")
    connected, code = await communicator.connect(timeout=10)  # no user in scope
    assert (connected, code) == (False, realtime.REFUSED)
    assert group not in fanout.process_fanout().feeds
    assert _numsub(group) == 0


async def test_events_that_arrive_during_a_resync_follow_it_in_order(viewer):
    group = f"test-fanout-{uuid.uuid4().hex[:10]}"
    resync_may_finish = threading.Event()
    stream = await _open(_echo_stream(group, resync_may_finish), viewer, resync=False)
    try:
        await _until(lambda: _numsub(group) == 1, "the process subscribed to the group")
        for n in range(3):
            await asyncio.to_thread(realtime.publish, group, "step", {"n": n})
        (subscription,) = fanout.process_fanout().feeds[group].subscribers
        await _until(lambda: len(subscription.backlog or ()) == 3, "the events were held back")
        resync_may_finish.set()
        frames = [json.loads(await stream.receive_from(timeout=10)) for _ in range(4)]
        assert frames == [{"resync": True}] + [{"event": "step", "n": n} for n in range(3)]
        assert subscription.backlog is None  # live: the fan-out writes to it directly now
        await asyncio.to_thread(realtime.publish, group, "step", {"n": 3})
        assert json.loads(await stream.receive_from(timeout=10)) == {"event": "step", "n": 3}
    finally:
        resync_may_finish.set()
        await stream.disconnect()


async def test_a_token_limited_to_one_source_never_receives_another_sources_gates(viewer):
    from controlplane.asgi import application

    source_ids: dict[str, int] = {}

    def setup() -> dict[str, list[tuple[bytes, bytes]]]:
        headers = {}
        for name in ("fleet-a", "fleet-b"):
            source = Source.objects.create(
                name=name, listener_url="http://127.0.0.1:9/", allowed_networks=["127.0.0.0/8"]
            )
            # A frame carries the gate as committed, so each push names a real gate row.
            Gate.objects.create(source=source, namespace="rl")
            source_ids[name] = source.pk
            _, secret = create_token(
                user=viewer, label=name, actor=Actor.system("test"), sources=[source]
            )
            headers[name] = [(b"authorization", f"Bearer {secret}".encode())]
        _, secret = create_token(user=viewer, label="all", actor=Actor.system("test"))
        headers["all"] = [(b"authorization", f"Bearer {secret}".encode())]
        return headers

    headers = await database_sync_to_async(setup)()
    # Two sockets per scope: each pair shares one render, the scopes never do.
    streams = {}
    for scope in ("fleet-a", "fleet-b", "all"):
        for i in range(2):
            c = WebsocketCommunicator(application, "/ws/gates/", headers=headers[scope])
            assert (await c.connect(timeout=10))[0]
            assert json.loads(await c.receive_from(timeout=10))["event"] == "gates.snapshot"
            streams[scope, i] = c
    await _until(lambda: _numsub(GATES_GROUP) == 1, "the process subscribed to the gates")
    try:
        for source in ("fleet-b", "fleet-a"):
            # A change, then its push: a stream is sent each gate revision once, and the
            # snapshot already showed the one the gate was created with.
            await database_sync_to_async(Gate.objects.filter(source_id=source_ids[source]).update)(
                revision=F("revision") + 1
            )
            gate = {"source": source, "source_id": source_ids[source], "namespace": "rl"}
            await asyncio.to_thread(realtime.publish, GATES_GROUP, "gate.changed", gate)

        async def sources(c: WebsocketCommunicator, count: int) -> list[str]:
            frames = [json.loads(await c.receive_from(timeout=10)) for _ in range(count)]
            return [frame["gate"]["source"] for frame in frames]

        for i in range(2):
            # Per stream, order is publish order: fleet-a arriving first means fleet-b never came.
            assert await sources(streams["fleet-a", i], 1) == ["fleet-a"]
            assert await sources(streams["fleet-b", i], 1) == ["fleet-b"]
            assert await sources(streams["all", i], 2) == ["fleet-b", "fleet-a"]
        for c in streams.values():
            assert await c.receive_nothing(timeout=0.3)
    finally:
        for c in streams.values():
            await c.disconnect()


# -- under uvicorn, frames written to the sockets directly -------------------------------------


def _session_cookie(user) -> str:
    client = Client()
    client.force_login(user)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"


def _stalled_client(port: int, cookie: str, path: str) -> socket.socket:
    """A websocket client that completes the handshake and then never reads."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: small window
    sock.connect(("127.0.0.1", port))
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        (
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            f"Cookie: {cookie}\r\n\r\n"
        ).encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    assert head.startswith(b"HTTP/1.1 101"), head
    return sock


def _read_until_cut(sock: socket.socket, limit: int) -> tuple[int, bool]:
    """Bytes read before the server ended the connection (or `limit`), and whether it did."""
    sock.settimeout(DEADLINE_SECONDS)
    total = 0
    try:
        while total < limit:
            chunk = sock.recv(1 << 16)
            if not chunk:
                return total, True
            total += len(chunk)
    except ConnectionResetError:
        return total, True
    except TimeoutError:
        return total, False
    return total, False


def _watched_worker() -> tuple[int, dict]:
    """A source with one worker; the row a discovery run would ship for it, minus its HTML."""
    from django.utils import timezone

    from controlplane.fleet.models import Worker, WorkerState

    source = Source.objects.create(name="fanout", listener_url="http://127.0.0.1:9/")
    now = timezone.now()
    worker = Worker.objects.create(
        source=source,
        namespace="rl",
        component="backend",
        endpoint="generate",
        instance_id="7",
        state=WorkerState.LIVE,
        first_seen_at=now,
        last_seen_at=now,
    )
    row = live.row_payload(worker)
    return source.pk, row


async def test_under_uvicorn_a_client_that_stops_reading_is_dropped_and_the_others_get_everything(
    viewer, tmp_path
):
    from websockets.asyncio.client import connect

    events, size = 120, 128 * 1024  # ~15 MB: far past the kernel's buffers and the drop limit
    cookie = await database_sync_to_async(_session_cookie)(viewer)
    source_id, row = await database_sync_to_async(_watched_worker)()
    path, group = f"/ws/fleet/sources/{source_id}/", live.source_group(source_id)
    with asgi_server(tmp_path / "uvicorn.log", server="uvicorn") as url:
        port = int(url.rsplit(":", 1)[1])
        ws_url = url.replace("http://", "ws://") + path
        stalled = await asyncio.to_thread(_stalled_client, port, cookie, path)
        async with connect(
            ws_url, additional_headers={"Cookie": cookie}, compression="deflate", max_size=None
        ) as reader:
            assert reader.protocol.extensions, "the client should have negotiated deflate"
            await reader.recv()  # the resync: the summary and timeline,
            await reader.recv()  # then the table, which shows the worker
            await _until(lambda: _numsub(group) == 1, "the server subscribed")

            def publish(first: int, count: int) -> None:
                # The worker's row as a discovery run ships it, padded to `size`: each event is
                # the summary (rendered once by the server) and this row's frame.
                for seq in range(first, first + count):
                    html = f'<tr id="worker-{row["id"]}" data-mark="mark-{seq:04d}">'
                    padded = {**row, "html": html + "x" * size + "</tr>"}
                    realtime.publish(
                        group, live.EVENT_WORKERS_CHANGED, {"stamp": "s", "rows": [padded]}
                    )
                assert realtime.flush(DEADLINE_SECONDS)

            # Paced in batches the reader has taken before the next goes out: a reading client
            # never has more than one batch (512 KB, under the drop limit) in flight, however
            # slowly this loaded machine lets it read, while the stalled one piles up all 15 MB.
            batch = 4
            seen = []
            for first in range(0, events, batch):
                await asyncio.to_thread(publish, first, batch)
                while len(seen) < first + batch:
                    frame = await asyncio.wait_for(reader.recv(), DEADLINE_SECONDS)
                    if 'data-mark="' in frame:
                        seen.append(frame.split('data-mark="', 1)[1][: len("mark-0000")])
            assert seen == [f"mark-{seq:04d}" for seq in range(events)]

        read, cut = await asyncio.to_thread(_read_until_cut, stalled, events * size)
        stalled.close()
        log = (tmp_path / "uvicorn.log").read_text()
    assert cut, "the server kept the stalled client"
    assert read < events * size
    # Cut for its unsent bytes: the direct write path, not the ASGI fallback's send timeout.
    assert "SourceStreamConsumer subscriber that does not read its socket" in log, log
