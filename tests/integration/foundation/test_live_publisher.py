"""The process's live publisher over the real Redis pub/sub channel layer.

Sync code (a Celery task, a service) publishes without waiting; frames reach real Channels
consumers in order; progress is coalesced but never overtakes or swallows a state change;
a dead or hanging Redis neither raises into nor blocks the caller; queued frames go out when
the process exits (atexit, Celery worker shutdown); a forked child publishes on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator

from controlplane import realtime
from controlplane.embedded.redis import free_port
from controlplane.realtime.publisher import Publisher

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("release_async_resources"),
]

ROOT = Path(__file__).resolve().parents[3]


def _group() -> str:
    return f"test-live-{uuid.uuid4().hex[:10]}"


async def _wait_subscribed(channel_name: str, timeout: float = 10.0) -> None:
    """SUBSCRIBE is sent without waiting for its reply: wait until Redis counts it."""
    client = redis.Redis.from_url(os.environ["REDIS_URL"])
    try:
        deadline = time.monotonic() + timeout
        while dict(client.pubsub_numsub(channel_name)).get(channel_name.encode(), 0) < 1:
            assert time.monotonic() < deadline, f"{channel_name} never subscribed"
            await asyncio.sleep(0.01)
    finally:
        client.close()


@contextlib.asynccontextmanager
async def subscribed(group: str) -> AsyncIterator:
    """A raw channel-layer subscriber of `group`; yields `receive(timeout)` for its messages."""
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add(group, channel)
    await _wait_subscribed(layer._get_layer()._get_group_channel_name(group))

    async def receive(timeout: float = 10.0) -> dict:
        return await asyncio.wait_for(layer.receive(channel), timeout)

    try:
        yield receive
    finally:
        await layer.group_discard(group, channel)


async def _nothing_more(receive, wait: float = 0.5) -> None:
    with pytest.raises(TimeoutError):
        extra = await receive(timeout=wait)
        pytest.fail(f"unexpected frame {extra}")


# -- delivery to a real consumer ---------------------------------------------------------------

RENDERS: list[tuple[str, int]] = []


class EchoStream(realtime.LiveStream):
    """Renders every event as JSON, counting renders (per subscriber)."""

    group = "test-live-echo"
    groups_to_join = (group,)

    def resync(self) -> list[str]:
        return [json.dumps({"resync": True})]

    def render(self, event: str, payload: dict) -> list[str]:
        RENDERS.append((type(self).__name__, payload.get("n", -1)))
        return [json.dumps({"event": event, **payload})]


class SharedEchoStream(EchoStream):
    """The same frames for every subscriber: rendered once per process and event."""

    group = "test-live-shared-echo"
    groups_to_join = (group,)
    shared_render = True


async def _connected(consumer, viewer) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(consumer.as_asgi(), "/ws/test/")
    communicator.scope["user"] = viewer
    connected, _ = await communicator.connect()
    assert connected
    assert json.loads(await communicator.receive_from(timeout=10)) == {"resync": True}
    layer = get_channel_layer()
    await _wait_subscribed(layer._get_layer()._get_group_channel_name(consumer.group))
    return communicator


async def test_publish_from_sync_code_reaches_a_live_stream_in_order(viewer):
    stream = await _connected(EchoStream, viewer)
    try:
        # From a thread with no event loop, as a Celery task or a service would.
        def publish_three() -> float:
            started = time.perf_counter()
            for n in range(3):
                realtime.publish(EchoStream.group, "step", {"n": n})
            return time.perf_counter() - started

        await asyncio.to_thread(publish_three)
        frames = [json.loads(await stream.receive_from(timeout=10)) for _ in range(3)]
        assert frames == [{"event": "step", "n": n} for n in range(3)]
    finally:
        await stream.disconnect()


async def test_a_shared_render_runs_once_for_every_subscriber_in_the_process(viewer):
    shared = [await _connected(SharedEchoStream, viewer) for _ in range(3)]
    own = [await _connected(EchoStream, viewer) for _ in range(2)]
    RENDERS.clear()
    try:
        await asyncio.to_thread(realtime.publish, SharedEchoStream.group, "state", {"n": 7})
        await asyncio.to_thread(realtime.publish, EchoStream.group, "state", {"n": 8})
        assert {await c.receive_from(timeout=10) for c in shared} == {
            json.dumps({"event": "state", "n": 7})
        }
        assert {await c.receive_from(timeout=10) for c in own} == {
            json.dumps({"event": "state", "n": 8})
        }
        assert sorted(RENDERS) == [("EchoStream", 8)] * 2 + [("SharedEchoStream", 7)]
    finally:
        for c in shared + own:
            await c.disconnect()


# -- coalescing --------------------------------------------------------------------------------


async def test_progress_is_coalesced_to_the_newest_and_never_overtakes_a_state_change():
    group = _group()
    async with subscribed(group) as receive:

        def burst() -> float:
            started = time.monotonic()
            for n in range(50):
                realtime.publish(group, "progress", {"n": n}, coalesce_key=("progress", group))
            realtime.publish(group, "state", {"state": "succeeded"})
            return time.monotonic() - started

        elapsed = await asyncio.to_thread(burst)
        received = [await receive()]
        while received[-1]["event"] != "state":
            received.append(await receive())
        await _nothing_more(receive)

    progress = [m["payload"]["n"] for m in received if m["event"] == "progress"]
    # The first goes at once; the rest of the burst waited and collapsed into the newest,
    # which went out before the state change that followed it.
    assert progress[0] == 0 and progress[-1] == 49, progress
    assert len(progress) <= 2 + int(elapsed * 4), (progress, elapsed)  # a slow burst: more
    assert [m["event"] for m in received][-1] == "state"
    assert progress == sorted(progress)


async def test_coalesced_progress_goes_out_at_most_a_few_times_a_second():
    group = _group()
    async with subscribed(group) as receive:

        def steady() -> float:
            started = time.monotonic()
            for n in range(60):  # ~100 per second for ~0.6 s
                realtime.publish(group, "progress", {"n": n}, coalesce_key=group)
                time.sleep(0.01)
            realtime.flush()
            return time.monotonic() - started

        elapsed = await asyncio.to_thread(steady)
        received = [await receive()]
        while received[-1]["payload"]["n"] != 59:
            received.append(await receive())
        await _nothing_more(receive)

    # One at once, then at most one per 1/4 s, the last value always delivered.
    assert len(received) <= 2 + int(elapsed * 4), (len(received), elapsed)
    assert [m["payload"]["n"] for m in received] == sorted(m["payload"]["n"] for m in received)


async def test_different_keys_coalesce_apart_and_plain_events_are_never_coalesced():
    group = _group()
    async with subscribed(group) as receive:

        def mixed() -> None:
            for n in range(5):
                realtime.publish(group, "progress", {"n": n, "refresh": 1}, coalesce_key=1)
                realtime.publish(group, "progress", {"n": n, "refresh": 2}, coalesce_key=2)
                realtime.publish(group, "step", {"n": n})

        await asyncio.to_thread(mixed)
        received = []
        while sum(m["event"] == "step" for m in received) < 5:
            received.append(await receive())
        await _nothing_more(receive)

    steps = [m["payload"]["n"] for m in received if m["event"] == "step"]
    assert steps == list(range(5))
    for refresh in (1, 2):
        seen = [m["payload"]["n"] for m in received if m["payload"].get("refresh") == refresh]
        assert seen == sorted(seen) and seen[-1] == 4, (refresh, seen)


# -- Redis down or hanging ---------------------------------------------------------------------


@pytest.fixture
def dead_redis(settings):
    """The channel layer pointed at a port nothing listens on."""
    layers = json.loads(json.dumps(settings.CHANNEL_LAYERS))
    layers["default"]["CONFIG"]["hosts"][0]["address"] = f"redis://127.0.0.1:{free_port()}/0"
    settings.CHANNEL_LAYERS = layers


@pytest.fixture
def hanging_redis(settings):
    """The channel layer pointed at a server that accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                accepted.append(server.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    layers = json.loads(json.dumps(settings.CHANNEL_LAYERS))
    port = server.getsockname()[1]
    layers["default"]["CONFIG"]["hosts"][0]["address"] = f"redis://127.0.0.1:{port}/0"
    settings.CHANNEL_LAYERS = layers
    yield
    stop.set()
    thread.join()
    for conn in accepted:
        conn.close()
    server.close()


def _timed_publishes(publisher: Publisher, count: int) -> list[float]:
    durations = []
    for n in range(count):
        started = time.perf_counter()
        publisher.submit("test-live-down", {"type": "stream.event", "n": n}, None)
        durations.append(time.perf_counter() - started)
    return durations


@pytest.mark.usefixtures("dead_redis")
def test_publish_with_redis_down_neither_raises_nor_blocks():
    publisher = Publisher(send_timeout=1.0)
    try:
        durations = _timed_publishes(publisher, 50)
        # A queue append: far under a millisecond, bounded here generously for a busy machine.
        assert max(durations) < 0.25, max(durations)
        assert publisher.flush(timeout=30)
        assert (publisher.sent, publisher.dropped) == (0, 50)
    finally:
        publisher.close()


@pytest.mark.usefixtures("hanging_redis")
def test_publish_with_redis_hanging_drops_after_the_send_timeout_and_a_full_queue_drops_at_once():
    publisher = Publisher(send_timeout=0.3, max_pending=5, stale_after=60)
    try:
        durations = _timed_publishes(publisher, 40)
        assert max(durations) < 0.25, max(durations)
        # Five queued, the other 35 refused on the spot; each queued one gives up after 0.3 s.
        assert publisher.dropped >= 35
        started = time.monotonic()
        assert publisher.flush(timeout=30)
        assert time.monotonic() - started < 5 * 0.3 + 5
        assert (publisher.sent, publisher.dropped) == (0, 40)
    finally:
        publisher.close()


# -- process exit and fork -----------------------------------------------------------------


def _run_script(body: str) -> subprocess.CompletedProcess:
    """Run `body` in a fresh Python with this run's settings and Redis prefix."""
    script = textwrap.dedent(
        """
        import os, django
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
        django.setup()
        from controlplane import realtime
        """
    ) + textwrap.dedent(body)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    return subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


async def _collect(receive, count: int) -> list[dict]:
    return [await receive(timeout=30) for _ in range(count)]


async def test_frames_queued_when_the_process_exits_are_sent():
    group = _group()
    async with subscribed(group) as receive:
        done = await asyncio.to_thread(
            _run_script,
            f"""
            for n in range(200):
                realtime.publish({group!r}, "step", {{"n": n}})
            realtime.publish({group!r}, "progress", {{"n": 1}}, coalesce_key="p")
            realtime.publish({group!r}, "progress", {{"n": 2}}, coalesce_key="p")
            # no flush: the interpreter's exit must send what is queued, held progress too
            """,
        )
        assert done.returncode == 0, done.stderr
        received = await _collect(receive, 202)
        await _nothing_more(receive)
    assert [m["payload"]["n"] for m in received] == [*range(200), 1, 2]


async def test_a_celery_worker_process_flushes_on_its_shutdown_signal():
    group = _group()
    async with subscribed(group) as receive:
        done = await asyncio.to_thread(
            _run_script,
            f"""
            from celery import signals
            for n in range(50):
                realtime.publish({group!r}, "step", {{"n": n}})
            signals.worker_process_shutdown.send(sender=None, pid=os.getpid(), exitcode=0)
            os._exit(0)  # how a prefork child leaves: no atexit
            """,
        )
        assert done.returncode == 0, done.stderr
        received = await _collect(receive, 50)
    assert [m["payload"]["n"] for m in received] == list(range(50))


async def test_a_forked_child_publishes_through_a_publisher_of_its_own():
    group = _group()
    async with subscribed(group) as receive:
        done = await asyncio.to_thread(
            _run_script,
            f"""
            realtime.publish({group!r}, "from", {{"who": "parent-before"}})
            assert realtime.flush()
            pid = os.fork()
            if pid == 0:
                # The parent's publisher thread did not survive the fork.
                realtime.publish({group!r}, "from", {{"who": "child"}})
                os._exit(0 if realtime.flush() else 3)
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0, status
            realtime.publish({group!r}, "from", {{"who": "parent-after"}})
            """,
        )
        assert done.returncode == 0, done.stderr
        received = await _collect(receive, 3)
        await _nothing_more(receive)
    assert [m["payload"]["who"] for m in received] == ["parent-before", "child", "parent-after"]
