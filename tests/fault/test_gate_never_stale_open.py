"""No stale "open" after a close, whatever Redis does (issue 23, item 5).

A gate polled through the fast path (`intake.api.fast_gate`) and watched over `ws/gates/` is
closed (a drift close, the gate writer's own code) while the web process's Redis misbehaves:

- **down**: the web's Redis is down (killed) while the close commits, so the writer can
  neither store nor delete the copy, and restarts with its data (append-only file);
- **flushed**: the copy is flushed right after the close stored it, and a reader that had read
  the row before the close primes the old state back (the compare-and-set forgot the newer
  revision with the flush);
- **another Redis**: the close is committed by a `manage.py` process configured with a
  different REDIS_URL, whose copy and push go where the web never looks.

Every poll whose start comes after the close is visible in the database must not answer
"open" (a 200 saying open, or a 304 to the open gate's ETag), and the websocket must never say
"open" after it either (including a late frame of the old state, as a publisher that held it
while Redis was away sends it) and must end up saying "closed" even when no push reaches it.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.db import connections
from django.db.models import F
from django.utils import timezone

from controlplane import redis_client
from controlplane.accounts.tokens import create_token
from controlplane.audit.recorder import Actor
from controlplane.embedded.redis import redis_server_binary
from controlplane.fleet.models import Source, Worker
from controlplane.intake.api import fast_gate
from controlplane.refresh import gate_cache, gates
from controlplane.refresh.live import EVENT_GATE_CHANGED, GATES_GROUP
from controlplane.refresh.models import Gate, GateState
from tests.api.test_fast_gate import DJANGO, CountingDjango, _call
from tests.fixtures.broker import KillableRedis, _answers, killable_redis, product_on, wait_until
from tests.fixtures.live_server import ROOT, _database_url

pytestmark = [pytest.mark.django_db(transaction=True)]

GATE = "/api/v1/gates/src-a/rl-a"
SETUP = Actor.system("stale gate test")
#: Polls made after the close is visible, per scenario (each one a fast path attempt).
READS_AFTER_CLOSE = 40
#: How long the websocket may take to say "closed" with no push reaching it (the watch runs
#: every 2 s); a bound for a hung test, not a timing assertion.
STREAM_DEADLINE_SECONDS = 30.0


def _redis_binary() -> str:
    binary = "/usr/bin/redis-server"
    return binary if os.path.exists(binary) else redis_server_binary()


class PersistentRedis(KillableRedis):
    """A killable Redis that keeps its data across a restart (append-only file, every write
    synced): down and back, as a Redis with persistence comes back after a crash."""

    def start(self, timeout: float = 10.0) -> None:
        options = ["--bind", "127.0.0.1", "--port", str(self.port), "--save", ""]
        options += ["--appendonly", "yes", "--appendfsync", "always", "--dir", str(self.data_dir)]
        self.process = subprocess.Popen(
            [_redis_binary(), *options],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        wait_until(lambda: _answers(self.port), timeout=timeout, what="redis-server to start")


@pytest.fixture
def web_redis(tmp_path, settings):
    """The web process's own Redis (copies, grants, channel layer), killable and flushable."""
    server = PersistentRedis(tmp_path / "web-redis")
    try:
        settings.REDIS_URL = server.url
        with product_on(server, settings):
            yield server
    finally:
        server.stop()


@pytest.fixture
def scene(web_redis, viewer, monkeypatch):
    # Copies live long enough that the fault, not their expiry or a rebuild ahead of it,
    # decides what a poll sees.
    monkeypatch.setattr(gate_cache, "TTL_SECONDS", 300)
    monkeypatch.setattr(gate_cache, "REFRESH_AHEAD_SECONDS", 1)
    now = timezone.now()
    source = Source.objects.create(
        name="src-a", listener_url="http://127.0.0.1:9/", allowed_networks=["127.0.0.0/8"]
    )
    for namespace in ("rl-a", "rl-b"):
        Worker.objects.create(
            source=source,
            namespace=namespace,
            component="backend",
            endpoint="generate",
            instance_id="7" if namespace == "rl-a" else "8",
            first_seen_at=now,
            last_seen_at=now,
        )
    gate = Gate.objects.create(
        source=source,
        namespace="rl-a",
        state=GateState.OPEN,
        verified_version="v1",
        verified_instances=["7"],
    )
    # Another gate: its change marks the end of the frames the test publishes.
    marker = Gate.objects.create(source=source, namespace="rl-b", state=GateState.CLOSED)
    _, secret = create_token(user=viewer, label="poller", actor=SETUP)
    headers = {"Host": "127.0.0.1", "Authorization": f"Bearer {secret}"}
    status, first, body = _call(DJANGO, GATE, headers)  # primes the grant and the copy
    assert status == 200 and json.loads(body)["open"] is True
    status, _, _ = _call(fast_gate.wrap(CountingDjango()), GATE, headers)
    assert status == 200
    return {
        "source": source,
        "gate": gate,
        "marker": marker,
        "secret": secret,
        "headers": headers,
        "etag": first["etag"],
        "payload": gates.serialize_gate(Gate.objects.select_related("source").get(pk=gate.pk)),
    }


class Poller(threading.Thread):
    """Polls the gate through the fast path until stopped; keeps the answers to the polls
    that began once the close was visible in the database."""

    def __init__(self, scene) -> None:
        super().__init__(daemon=True)
        self.scene = scene
        self.revision = scene["payload"]["revision"]
        self.django = CountingDjango()
        self.app = fast_gate.wrap(self.django)
        self.stop = threading.Event()
        self.after: list[tuple[int, bool]] = []  # (status, answered in front of Django)
        self.open_answers: list[str] = []
        self.error: BaseException | None = None

    def closed_in_database(self) -> bool:
        row = Gate.objects.filter(pk=self.scene["gate"].pk).values_list("revision", flat=True)
        return row.first() > self.revision

    def run(self) -> None:
        try:
            conditional = False
            while not self.stop.is_set():
                committed = self.closed_in_database()
                headers = dict(self.scene["headers"])
                if conditional:
                    headers["If-None-Match"] = self.scene["etag"]
                before = self.django.calls
                status, _, body = _call(self.app, GATE, headers)
                if committed:
                    self.after.append((status, self.django.calls == before))
                    if status == 304 or (status == 200 and json.loads(body)["open"]):
                        self.open_answers.append(f"{status} {body[:120]!r}")
                conditional = not conditional
        except BaseException as error:  # reported by the test
            self.error = error
        finally:
            connections.close_all()

    def reads_after(self, count: int) -> None:
        start = len(self.after)
        wait_until(lambda: len(self.after) >= start + count, timeout=120, what="polls")


class Watcher(threading.Thread):
    """One `ws/gates/` client connected before the close, in an event loop of its own: every
    gate frame it receives, until it has seen the marker gate and rl-a closed (or a deadline)."""

    def __init__(self, secret: str, *, wait_for_marker: bool) -> None:
        super().__init__(daemon=True)
        self.secret = secret
        self.wait_for_marker = wait_for_marker
        self.ready = threading.Event()
        self.frames: list[dict] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            asyncio.run(self._watch())
        except BaseException as error:
            self.error = error
        finally:
            connections.close_all()

    def saw(self, namespace: str, *, open: bool) -> bool:
        return any(f["namespace"] == namespace and f["open"] is open for f in self.frames)

    async def _watch(self) -> None:
        from controlplane.asgi import application

        headers = [(b"authorization", f"Bearer {self.secret}".encode())]
        client = WebsocketCommunicator(application, "/ws/gates/", headers=headers)
        ok, code = await client.connect(timeout=10)
        assert ok, code
        snapshot = json.loads(await client.receive_from(timeout=10))
        assert snapshot["event"] == "gates.snapshot"
        self.ready.set()
        deadline = time.monotonic() + STREAM_DEADLINE_SECONDS
        try:
            while time.monotonic() < deadline:
                # (receive_from's timeout would cancel the application: wait without it)
                if await client.receive_nothing(timeout=0.5, interval=0.05):
                    continue
                frame = json.loads(await client.receive_from(timeout=10))
                self.frames.append(frame["gate"])
                marked = self.saw("rl-b", open=False) or not self.wait_for_marker
                if marked and self.saw("rl-a", open=False):
                    break
        finally:
            await client.disconnect()
            await redis_client.async_client().aclose()


def _late_frames(scene) -> None:
    """The old open state arriving after the close, as a publisher that held it sends it, then
    the marker gate's frame (same sender: it arrives after). The marker gate moves to a new
    revision first: a stream is sent each revision once, and its snapshot showed the old one."""
    layer = get_channel_layer()
    Gate.objects.filter(pk=scene["marker"].pk).update(revision=F("revision") + 1)
    marker = gates.serialize_gate(Gate.objects.select_related("source").get(pk=scene["marker"].pk))
    for number, payload in enumerate((scene["payload"], marker)):
        message = {
            "type": "stream.event",
            "event": EVENT_GATE_CHANGED,
            "payload": payload,
            "id": f"late-{number}",
        }
        async_to_sync(layer.group_send)(GATES_GROUP, message)


def _close_here(scene) -> None:
    gates.close_for_drift(scene["gate"].pk, actor=SETUP, reason="drift: worker 7 regressed")


def _snapshot_after(secret: str) -> list[dict]:
    from controlplane.asgi import application

    async def read() -> list[dict]:
        headers = [(b"authorization", f"Bearer {secret}".encode())]
        client = WebsocketCommunicator(application, "/ws/gates/", headers=headers)
        ok, code = await client.connect(timeout=10)
        assert ok, code
        try:
            return json.loads(await client.receive_from(timeout=10))["gates"]
        finally:
            await client.disconnect()
            await redis_client.async_client().aclose()

    return asyncio.run(read())


def _run(scene, fault_report, close_under_fault, *, late_frame: bool) -> None:
    watcher = Watcher(scene["secret"], wait_for_marker=late_frame)
    watcher.start()
    assert watcher.ready.wait(30), watcher.error
    poller = Poller(scene)
    poller.start()
    try:
        close_under_fault()
        if late_frame:
            _late_frames(scene)
        poller.reads_after(READS_AFTER_CLOSE)
    finally:
        poller.stop.set()
        poller.join(60)
    watcher.join(STREAM_DEADLINE_SECONDS + 30)
    assert poller.error is None, poller.error
    assert watcher.error is None, watcher.error
    snapshot = {g["namespace"]: g for g in _snapshot_after(scene["secret"])}
    stream_open = [f for f in watcher.frames if f["namespace"] == "rl-a" and f["open"]]
    fault_report(
        polls_after_close=len(poller.after),
        open_answers=len(poller.open_answers),
        answered_in_front_of_django=sum(1 for _, fast in poller.after if fast),
        handed_to_django=poller.django.calls,
        stream_frames=len(watcher.frames),
        stream_open_frames=len(stream_open),
        stream_said_closed=watcher.saw("rl-a", open=False),
    )
    assert poller.open_answers == [], poller.open_answers[:5]
    assert stream_open == [], stream_open
    assert watcher.saw("rl-a", open=False), watcher.frames
    assert snapshot["rl-a"]["state"] == GateState.CLOSED
    # The stale copy was there and refused: a poll (the one the close overlapped, or a later
    # one) was handed to Django, which answered from the row and put the current copy back.
    # Before the close every poll was answered in front of Django.
    assert poller.django.calls >= 1, "no poll met the stale copy"
    # ...and once the copy is current again, polls are answered in front of Django again.
    assert any(fast for _, fast in poller.after[-5:]), poller.after[-5:]


def test_redis_down_while_the_close_commits(scene, web_redis, fault_report):
    def close() -> None:
        web_redis.kill()
        try:
            _close_here(scene)  # the copy can be neither stored nor deleted
        finally:
            web_redis.start()  # back, with the old copy in it

    _run(scene, fault_report, close, late_frame=True)


def test_redis_flushed_after_the_close(scene, web_redis, fault_report):
    def close() -> None:
        _close_here(scene)
        redis_client.sync_client().flushall()
        # A reader that read the row before the close primes what it read: with the newer
        # revision flushed away, the compare-and-set lets it in.
        gate_cache.prime(scene["payload"], scene["source"].pk)
        # The token's grant went with the flush: one Django answer puts it back.
        _call(DJANGO, "/api/v1/gates/src-a/rl-b", scene["headers"])

    _run(scene, fault_report, close, late_frame=True)


def test_a_writer_configured_with_another_redis(scene, tmp_path, fault_report):
    with killable_redis(tmp_path / "other-redis") as other:

        def close() -> None:
            code = (
                "from controlplane.audit.recorder import Actor\n"
                "from controlplane.refresh import gates\n"
                f"gates.close_for_drift({scene['gate'].pk}, actor=Actor.system('ops shell'),"
                " reason='closed from a shell with its own Redis')\n"
            )
            env = dict(os.environ, REDIS_URL=other.url, DATABASE_URL=_database_url())
            env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
            done = subprocess.run(
                [sys.executable, "manage.py", "shell", "-c", code],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode == 0, done.stderr[-4000:]
            assert Gate.objects.get(pk=scene["gate"].pk).state == GateState.CLOSED

        _run(scene, fault_report, close, late_frame=False)


def test_the_check_costs_one_read_for_many_polls(scene):
    """The fast path's revision check is shared: polls that arrive together wait for one read
    (the figure behind keeping the gate API near the bare handler's speed)."""
    from controlplane.intake.api import gate_revisions

    calls: list[frozenset] = []
    real = gate_revisions.read_revisions

    async def counted(reader, scopes):
        calls.append(frozenset(scopes))
        return await real(reader, scopes)

    async def many() -> list[int | None]:
        gate_revisions.read_revisions = counted
        try:
            return await asyncio.gather(
                *(gate_revisions.committed_revision("src-a", "rl-a") for _ in range(32))
            )
        finally:
            gate_revisions.read_revisions = real

    answers = asyncio.run(many())
    assert answers == [(scene["payload"]["revision"], 0)] * 32
    assert 1 <= len(calls) <= 2, len(calls)
