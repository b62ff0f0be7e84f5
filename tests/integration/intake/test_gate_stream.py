"""`ws/gates/` through the deployed ASGI application and a real Redis channel layer: who may
connect, the snapshot first, then each gate change — and only the sources a token may see."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.db import connection
from django.db.models import F
from django.test import Client
from django.test.utils import CaptureQueriesContext

from controlplane.accounts.tokens import create_token
from controlplane.audit.recorder import Actor
from controlplane.fleet.models import Source
from controlplane.intake import consumers
from controlplane.refresh import intents
from controlplane.refresh.live import EVENT_GATE_CHANGED, GATES_GROUP
from controlplane.refresh.models import Gate, GateState
from tests.postgres import postgres_only

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("release_async_resources"),
]

SETUP = Actor.system("gate stream test")


@pytest.fixture(autouse=True)
def fresh_stream_records(monkeypatch):
    """The snapshots and renders of an earlier test's streams are not this test's: their gates
    are gone, and a test that resets the sequences (`reset_sequences=True`) makes a later
    test's gates reuse their ids. An earlier render of gate 1 at revision 3 would then count
    as this test's gate 1 having been sent, and the watch would never send its revision 2.
    (In a running server ids are never reused: the rows are not truncated.)"""
    monkeypatch.setattr(consumers, "_shown", consumers._Shown())
    monkeypatch.setattr(consumers, "_rendered", {})


@pytest.fixture
def gates(db):
    """Two sources, one closed gate each."""
    made = {}
    for name, namespace in (("fleet-a", "rl-a"), ("fleet-b", "rl-b")):
        source = Source.objects.create(
            name=name, listener_url="http://127.0.0.1:9/", allowed_networks=["127.0.0.0/8"]
        )
        made[name] = Gate.objects.create(
            source=source, namespace=namespace, state=GateState.CLOSED, reason="held by hand"
        )
    return made


def bearer(secret: str) -> list[tuple[bytes, bytes]]:
    # No Origin header: what a rollout framework's websocket client sends by default.
    return [(b"authorization", f"Bearer {secret}".encode())]


def token_for(user, *, label: str = "rollout", sources=()) -> str:
    _, secret = create_token(user=user, label=label, actor=SETUP, sources=sources)
    return secret


def session_headers(user, origin: str = "http://testserver") -> list[tuple[bytes, bytes]]:
    client = Client()
    client.force_login(user)
    cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"
    return [(b"cookie", cookie.encode()), (b"origin", origin.encode())]


def communicator(headers, path: str = "/ws/gates/") -> WebsocketCommunicator:
    from controlplane.asgi import application

    return WebsocketCommunicator(application, path, headers=headers)


async def connected(headers, path: str = "/ws/gates/") -> WebsocketCommunicator:
    c = communicator(headers, path)
    ok, code = await c.connect(timeout=10)
    assert ok, f"refused with close code {code}"
    return c


def reopen(gate: Gate, user) -> None:
    intents.force_reopen_gate(gate, actor=Actor.for_user(user), reason="checked by hand")


def view(gate: Gate) -> tuple:
    return (gate["source"], gate["namespace"], gate["open"], gate["revision"])


# -- who may connect ------------------------------------------------------------------------------


async def test_anonymous_and_bad_credentials_are_refused(gates, django_user_model):
    nobody = await database_sync_to_async(django_user_model.objects.create_user)("nobody", "x")
    no_role_secret = await database_sync_to_async(token_for)(nobody, label="no-role")
    for headers in (
        [],  # anonymous, no Origin
        [(b"origin", b"http://testserver")],  # anonymous browser
        bearer("cpt_000000000000_" + "x" * 43),  # unknown token
        [(b"authorization", b"Basic dXNlcjpwYXNz")],
        bearer(no_role_secret),  # a real token of a user without the view permission
    ):
        ok, code = await communicator(headers).connect(timeout=10)
        assert (ok, code) == (False, 4401), headers


async def test_a_session_from_another_site_is_refused(gates, viewer):
    headers = await database_sync_to_async(session_headers)(viewer, "http://evil.example")
    ok, _ = await communicator(headers).connect(timeout=10)
    assert not ok


async def test_a_bearer_token_without_an_origin_gets_the_snapshot_first(gates, viewer):
    secret = await database_sync_to_async(token_for)(viewer)
    c = await connected(bearer(secret))
    first = await c.receive_json_from(timeout=10)
    assert first["event"] == "gates.snapshot"
    assert [view(g) for g in first["gates"]] == [
        ("fleet-a", "rl-a", False, 1),
        ("fleet-b", "rl-b", False, 1),
    ]
    assert first["gates"][0]["reason"] == "held by hand"
    await c.disconnect()


async def test_a_session_from_this_site_gets_the_snapshot_first(gates, viewer):
    headers = await database_sync_to_async(session_headers)(viewer)
    c = await connected(headers)
    first = await c.receive_json_from(timeout=10)
    assert first["event"] == "gates.snapshot" and len(first["gates"]) == 2
    await c.disconnect()


# -- changes --------------------------------------------------------------------------------------


async def test_a_gate_change_reaches_the_subscriber(gates, viewer, approver):
    secret = await database_sync_to_async(token_for)(viewer)
    c = await connected(bearer(secret))
    await c.receive_json_from(timeout=10)  # snapshot

    await database_sync_to_async(reopen)(gates["fleet-a"], approver)
    change = await c.receive_json_from(timeout=10)
    assert change["event"] == "gate.changed"
    assert view(change["gate"]) == ("fleet-a", "rl-a", True, 2)
    # A forced reopen is never shown like a verified one: its state and reason say so.
    assert change["gate"]["state"] == "open_forced"
    assert change["gate"]["reason"] == "checked by hand"
    assert change["gate"]["forced"]["reason"] == "checked by hand"
    await c.disconnect()


async def test_a_token_limited_to_one_source_sees_only_that_source(gates, viewer, approver):
    only_b = gates["fleet-b"].source
    secret = await database_sync_to_async(token_for)(viewer, label="only-b", sources=[only_b])
    c = await connected(bearer(secret))
    snapshot = await c.receive_json_from(timeout=10)
    assert [view(g) for g in snapshot["gates"]] == [("fleet-b", "rl-b", False, 1)]

    # fleet-a changes first; the layer keeps one channel's messages in order, so had it been
    # forwarded it would arrive before fleet-b's.
    await database_sync_to_async(reopen)(gates["fleet-a"], approver)
    await database_sync_to_async(reopen)(gates["fleet-b"], approver)
    change = await c.receive_json_from(timeout=10)
    assert view(change["gate"]) == ("fleet-b", "rl-b", True, 2)
    assert await c.receive_nothing(timeout=0.5)
    await c.disconnect()


async def test_the_source_filter_narrows_an_unlimited_stream(gates, viewer, approver):
    secret = await database_sync_to_async(token_for)(viewer)
    c = await connected(bearer(secret), "/ws/gates/?source=fleet-b")
    snapshot = await c.receive_json_from(timeout=10)
    assert [g["source"] for g in snapshot["gates"]] == ["fleet-b"]

    await database_sync_to_async(reopen)(gates["fleet-a"], approver)
    await database_sync_to_async(reopen)(gates["fleet-b"], approver)
    change = await c.receive_json_from(timeout=10)
    assert view(change["gate"]) == ("fleet-b", "rl-b", True, 2)
    await c.disconnect()


async def test_messages_from_the_client_are_ignored(gates, viewer):
    secret = await database_sync_to_async(token_for)(viewer)
    c = await connected(bearer(secret))
    await c.receive_json_from(timeout=10)
    await c.send_to(text_data=json.dumps({"event": "gate.open", "namespace": "rl-a"}))
    assert await c.receive_nothing(timeout=0.5)
    gate = await database_sync_to_async(Gate.objects.get)(namespace="rl-a")
    assert not gate.is_open
    await c.disconnect()


# -- each revision once, never an older one after a newer ----------------------------------------


def _move_without_a_push(gate: Gate) -> None:
    """A committed change whose push has not reached the stream yet (still on its way, or lost)."""
    Gate.objects.filter(pk=gate.pk).update(revision=F("revision") + 1, reason="moved quietly")


def _late_push(gate: Gate) -> None:
    """The push of that change, arriving after all: the wake-up every writer publishes."""
    source = gate.source
    payload = {"source": source.name, "source_id": source.pk, "namespace": gate.namespace}
    message = {"type": "stream.event", "event": EVENT_GATE_CHANGED, "payload": payload}
    async_to_sync(get_channel_layer().group_send)(GATES_GROUP, {**message, "id": "late"})


async def _gate_frames_until(c: WebsocketCommunicator, namespace: str, revision: int) -> list:
    """Every gate frame up to the one showing `namespace` at `revision` (the test's marker)."""
    frames = []
    while True:
        frame = await c.receive_json_from(timeout=10)
        frames.append(view(frame["gate"]))
        if frames[-1][1] == namespace and frames[-1][3] == revision:
            return frames


async def _watch_after_its_first_read(viewer, monkeypatch) -> WebsocketCommunicator:
    """A stream whose snapshot has arrived and whose process's watch has made its first read
    (its baseline), reading again every 50 ms."""
    monkeypatch.setattr(consumers, "WATCH_SECONDS", 0.05)
    read = threading.Event()
    real_revisions = consumers._revisions

    def revisions():
        found = real_revisions()
        read.set()
        return found

    monkeypatch.setattr(consumers, "_revisions", revisions)
    secret = await database_sync_to_async(token_for)(viewer)
    c = await connected(bearer(secret))
    await c.receive_json_from(timeout=10)  # snapshot
    assert await asyncio.to_thread(read.wait, 10)
    return c


async def test_a_revision_the_watch_recovered_is_not_sent_again_when_its_push_arrives(
    gates, viewer, approver, monkeypatch
):
    # The watch's first read is its baseline: the quiet change must come after it (on a busy
    # machine that read can land after the change, which it then counts as accounted for).
    c = await _watch_after_its_first_read(viewer, monkeypatch)

    # The watch finds the change no push announced and sends it...
    await database_sync_to_async(_move_without_a_push)(gates["fleet-a"])
    recovered = await c.receive_json_from(timeout=10)
    assert view(recovered["gate"]) == ("fleet-a", "rl-a", False, 2)
    # ...then the push arrives: the stream has that revision already. A later change of the
    # other gate marks the end of what the late push could have sent.
    await database_sync_to_async(_late_push)(gates["fleet-a"])
    await database_sync_to_async(reopen)(gates["fleet-b"], approver)
    assert await _gate_frames_until(c, "rl-b", 2) == [("fleet-b", "rl-b", True, 2)]
    await c.disconnect()


async def test_a_change_between_the_snapshot_and_the_watchs_first_read_is_recovered(
    gates, viewer, monkeypatch
):
    """The watch's first read is not what the streams have: a change committed after the
    snapshot and before that read, its push lost, is sent all the same."""
    monkeypatch.setattr(consumers, "WATCH_SECONDS", 0.05)
    real_revisions = consumers._revisions
    moved = threading.Event()

    def revisions():
        if not moved.is_set():  # the watch's first read: the change lands just before it
            moved.set()
            _move_without_a_push(gates["fleet-a"])
        return real_revisions()

    monkeypatch.setattr(consumers, "_revisions", revisions)
    secret = await database_sync_to_async(token_for)(viewer)
    c = await connected(bearer(secret))
    snapshot = await c.receive_json_from(timeout=10)
    assert ("fleet-a", "rl-a", False, 1) in [view(g) for g in snapshot["gates"]]
    recovered = await c.receive_json_from(timeout=10)
    assert view(recovered["gate"]) == ("fleet-a", "rl-a", False, 2)
    assert moved.is_set()
    await c.disconnect()


async def test_a_revision_the_snapshot_showed_is_not_sent_again_by_its_late_push(
    gates, viewer, approver
):
    secret = await database_sync_to_async(token_for)(viewer)
    before = await connected(bearer(secret))
    await before.receive_json_from(timeout=10)
    await database_sync_to_async(_move_without_a_push)(gates["fleet-a"])
    after = await connected(bearer(secret))
    snapshot = await after.receive_json_from(timeout=10)
    assert ("fleet-a", "rl-a", False, 2) in [view(g) for g in snapshot["gates"]]

    await database_sync_to_async(_late_push)(gates["fleet-a"])
    await database_sync_to_async(reopen)(gates["fleet-b"], approver)
    # The stream connected before gets the change once; the one whose snapshot showed it, not.
    assert await _gate_frames_until(before, "rl-b", 2) == [
        ("fleet-a", "rl-a", False, 2),
        ("fleet-b", "rl-b", True, 2),
    ]
    assert await _gate_frames_until(after, "rl-b", 2) == [("fleet-b", "rl-b", True, 2)]
    await before.disconnect()
    await after.disconnect()


async def test_a_render_recorded_for_another_row_with_the_same_id_does_not_hide_a_change(
    gates, viewer, monkeypatch
):
    """A database whose sequences were reset gives a deleted gate's id again. A revision
    rendered for the old row, above the new row's, must not count as the new row's for a
    stream that connected after (the fixture starts each test with no renders on record; this
    test puts one there)."""
    c = await _watch_after_its_first_read(viewer, monkeypatch)
    consumers._rendered[gates["fleet-a"].pk] = 50  # the old row's, from before
    await database_sync_to_async(_move_without_a_push)(gates["fleet-a"])
    recovered = await c.receive_json_from(timeout=10)
    assert view(recovered["gate"]) == ("fleet-a", "rl-a", False, 2)
    await c.disconnect()


# -- what an event costs ---------------------------------------------------------------------------

STREAMS_ON_ONE_KEY = 12


async def _streams_counting_reads(gate, viewer, monkeypatch) -> tuple[list, list[int], int]:
    """Streams of one token scope, snapshots read; the statements of each render since; and
    the statements of one render of `gate` alone."""
    lone = await database_sync_to_async(_reads_of_one_render)(gate)
    reads: list[int] = []  # statements per render, one entry per render
    real = consumers.GateStreamConsumer.render

    def counted(self, event, payload):
        with CaptureQueriesContext(connection) as statements:
            frames = real(self, event, payload)
        reads.append(len(statements))
        return frames

    monkeypatch.setattr(consumers.GateStreamConsumer, "render", counted)
    secret = await database_sync_to_async(token_for)(viewer)
    streams = [await connected(bearer(secret)) for _ in range(STREAMS_ON_ONE_KEY)]
    for c in streams:
        await c.receive_json_from(timeout=10)  # snapshot
    return streams, reads, lone


async def test_a_push_is_read_once_for_every_stream_of_one_scope(
    gates, viewer, approver, monkeypatch
):
    """Streams with the same token scope and source share one render: one row read per event
    per process, however many there are."""
    monkeypatch.setattr(consumers, "WATCH_SECONDS", 3600)  # only the push renders here
    streams, reads, lone = await _streams_counting_reads(gates["fleet-b"], viewer, monkeypatch)

    await database_sync_to_async(reopen)(gates["fleet-a"], approver)
    for c in streams:
        assert view((await c.receive_json_from(timeout=10))["gate"])[1:] == ("rl-a", True, 2)
    assert reads == [lone]
    for c in streams:
        await c.disconnect()


async def test_a_lost_push_the_watch_recovers_is_read_once_for_every_stream_of_one_scope(
    gates, viewer, monkeypatch
):
    monkeypatch.setattr(consumers, "WATCH_SECONDS", 0.05)
    streams, reads, lone = await _streams_counting_reads(gates["fleet-b"], viewer, monkeypatch)

    await database_sync_to_async(_move_without_a_push)(gates["fleet-b"])
    for c in streams:
        assert view((await c.receive_json_from(timeout=10))["gate"])[1:] == ("rl-b", False, 2)
    assert reads == [lone]
    for c in streams:
        await c.disconnect()


def _reads_of_one_render(gate: Gate) -> int:
    """Statements one render of `gate` makes (what the lag read costs is not this test's)."""
    stream = consumers.GateStreamConsumer()
    stream.allowed_names, stream.source_name = None, ""
    payload = {"source": gate.source.name, "source_id": gate.source_id, "namespace": gate.namespace}
    with CaptureQueriesContext(connection) as statements:
        assert stream.render(EVENT_GATE_CHANGED, payload)
    return len(statements)


class SteppedWatch:
    """The watch's reads, one at a time when the test says (in place of its timer)."""

    def __init__(self) -> None:
        self.reads_done = 0
        self._done = asyncio.Event()
        self._go: asyncio.Queue[None] = asyncio.Queue()

    async def until_next_read(self) -> None:  # consumers._until_next_read
        self.reads_done += 1
        self._done.set()
        await self._go.get()

    async def reads(self, count: int) -> None:
        """Let the watch read `count` more times, and wait until it has handled the last (with
        0: until it has handled its first read)."""
        target = max(1, self.reads_done + count)
        for _ in range(count):
            self._go.put_nowait(None)
        while self.reads_done < target:
            self._done.clear()
            await asyncio.wait_for(self._done.wait(), timeout=10)


async def test_a_push_on_its_way_when_the_watch_reads_is_rendered_once(gates, viewer, monkeypatch):
    """The watch sees a change before its push reaches the process: the push gets a whole
    watch interval to arrive before the watch sends the gate itself."""
    watch = SteppedWatch()
    monkeypatch.setattr(consumers, "_until_next_read", watch.until_next_read)
    streams, reads, lone = await _streams_counting_reads(gates["fleet-a"], viewer, monkeypatch)
    await watch.reads(0)  # the first read, which the snapshots account for

    await database_sync_to_async(_move_without_a_push)(gates["fleet-a"])  # its push: on its way
    await watch.reads(1)
    assert reads == []  # seen, not yet sent: the push may still come
    await database_sync_to_async(_late_push)(gates["fleet-a"])
    for c in streams:
        assert view((await c.receive_json_from(timeout=10))["gate"])[1:] == ("rl-a", False, 2)
    await watch.reads(2)
    assert reads == [lone]
    for c in streams:
        assert await c.receive_nothing(timeout=0.1)
        await c.disconnect()


def _snapshot_reads(source: Source, namespaces: int) -> int:
    """Statements of one snapshot of `source`'s gates, with `namespaces` of them."""
    have = Gate.objects.filter(source=source).count()
    for i in range(have, namespaces):
        Gate.objects.create(source=source, namespace=f"rl-x{i}", state=GateState.CLOSED)
    stream = consumers.GateStreamConsumer()
    stream.limit, stream.source_name = None, source.name
    with CaptureQueriesContext(connection) as statements:
        (frame,) = stream.resync()
    assert len(json.loads(frame.text)["gates"]) == namespaces
    return len(statements)


@postgres_only  # on SQLite the lag reads one query per namespace, by design (policy_lag)
def test_a_snapshot_reads_the_lag_per_source_not_per_gate(gates):
    """Every connect sends a snapshot: its statements do not grow with the gates it shows."""
    source = gates["fleet-a"].source
    assert _snapshot_reads(source, 1) == _snapshot_reads(source, 8)


def test_a_filtered_snapshot_lowers_only_the_gates_it_showed():
    """A snapshot of one source says nothing of the other sources' gates: it must not make
    the watch resend them all (every filtered connect would). An unfiltered snapshot counts
    a gate newer than all it showed as never sent (created after it, its push lost)."""
    shown = consumers._Shown()
    accounted = {1: 5, 2: 7, 3: 2}
    shown.add(((1, 4),), every_gate=False)
    shown.lower(accounted, [1, 2, 3])
    assert accounted == {1: 4, 2: 7, 3: 2}

    shown.add(((1, 4), (2, 7)), every_gate=True)
    shown.lower(accounted, [1, 2, 3])
    assert accounted == {1: 4, 2: 7, 3: 0}

    shown.lower(accounted, [1, 2, 3])  # forgotten once applied
    assert accounted == {1: 4, 2: 7, 3: 0}
