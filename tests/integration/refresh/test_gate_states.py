"""Gate states on every surface: a stale source's gates say `unknown` over the API and both
websockets and come back to what they were; a too-old discovery does the same through the beat
task; a forced gate never looks verified; every state change is notified and carries `since`."""

from __future__ import annotations

import asyncio
import json
import re
import time
from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.db import connections, transaction
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from controlplane.audit.models import AuditEvent
from controlplane.audit.recorder import Actor
from controlplane.fleet.discovery import run_discovery
from controlplane.fleet.models import DiscoveryTrigger, Source
from controlplane.intake.forms import DestinationForm
from controlplane.notify.models import NotificationDelivery, NotificationDestination
from controlplane.refresh import gates, ledger
from controlplane.refresh.models import Admission, Evidence, Gate, GateState
from controlplane.refresh.tasks import sync_gate_freshness
from controlplane.routing import websocket_urlpatterns
from tests.integration.fleet.conftest import closed_port_url
from tests.integration.refresh.helpers import (
    NAMESPACES,
    fleet_config,
    make_source,
    run_inline,
    wait_for,
)

pytestmark = [pytest.mark.django_db(transaction=True)]


def _destination() -> NotificationDestination:
    """Every event, nowhere reachable: deliveries are stored rows we can read."""
    return NotificationDestination.objects.create(
        name="all-events", kind="webhook", url="http://127.0.0.1:9/hook", allowed_networks=[]
    )


def _notified(event: str) -> list[dict]:
    return [
        d.payload
        for d in NotificationDelivery.objects.filter(event=event).order_by("created_at", "id")
    ]


@pytest.fixture
def open_source(simfleet_factory, operator):
    """A source whose three namespaces were refreshed and verified: every gate `open`."""
    fleet = simfleet_factory(fleet_config(3))
    source = make_source(fleet)
    _destination()
    refresh = run_inline(source, operator)
    assert refresh.state == "succeeded", refresh.held_reason
    return source


def _api(client: Client, source: Source, namespace: str) -> dict:
    response = client.get(f"/api/v1/gates/{source.name}/{namespace}")
    assert response.status_code == 200, response.content
    return response.json()


def _api_in_thread(client: Client, source: Source, namespace: str) -> dict:
    try:
        return _api(client, source, namespace)
    finally:
        connections.close_all()  # this thread's own connection


def _discover(source_id: int, listener_url: str | None = None) -> None:
    """One discovery run in its own thread (like a Celery worker), optionally re-pointed."""
    try:
        if listener_url is not None:
            Source.objects.filter(pk=source_id).update(listener_url=listener_url)
        run_discovery(source_id, trigger=DiscoveryTrigger.MANUAL)
    finally:
        connections.close_all()


async def _frames_until(c: WebsocketCommunicator, predicate, timeout: float = 30.0) -> list[str]:
    deadline = time.monotonic() + timeout
    frames: list[str] = []
    while not frames or not predicate(frames[-1]):
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"no matching frame before the deadline; got {frames!r:.400}"
        frames.append(await c.receive_from(timeout=remaining))
    return frames


def _communicator(path: str, user) -> WebsocketCommunicator:
    c = WebsocketCommunicator(URLRouter(websocket_urlpatterns), path)
    c.scope["user"] = user
    return c


def test_a_refresh_notifies_one_closed_and_one_opened_for_all_its_namespaces(open_source):
    closed, opened = _notified("gate.closed"), _notified("gate.opened")
    assert len(closed) == 1 and len(opened) == 1, (closed, opened)
    assert sorted(g["namespace"] for g in closed[0]["data"]["gates"]) == sorted(NAMESPACES)
    assert {g["state"] for g in closed[0]["data"]["gates"]} == {"closed"}
    assert closed[0]["data"]["refresh"]["id"] and closed[0]["data"]["source"]["name"] == "sim"
    reopened = opened[0]["data"]["gates"]
    assert {g["state"] for g in reopened} == {"open"}
    assert all(g["since"] and g["verified_count"] == 1 for g in reopened)
    # A subscriber can choose the new events.
    choices = {value for value, _ in DestinationForm.base_fields["events"].choices}
    assert {"gate.opened", "gate.closed", "gate.unknown", "gate.force_reopened"} <= choices


@pytest.mark.usefixtures("release_async_resources")
async def test_a_stale_source_is_unknown_over_api_and_websockets_then_recovers(
    open_source, viewer, viewer_client
):
    source = open_source
    before = await asyncio.to_thread(_api_in_thread, viewer_client, source, "rl-a")
    assert before["state"] == "open" and before["open"] is True
    good_url = source.listener_url

    api_stream = _communicator("/ws/gates/", viewer)
    page_stream = _communicator("/ws/gate-table/", viewer)
    for c in (api_stream, page_stream):
        connected, _ = await c.connect()
        assert connected
    snapshot = json.loads(await api_stream.receive_from(timeout=10))
    assert {g["state"] for g in snapshot["gates"]} == {"open"}
    await page_stream.receive_from(timeout=10)  # the table's resync
    await page_stream.receive_from(timeout=10)  # the banner's

    await asyncio.to_thread(_discover, source.pk, closed_port_url())

    def unknown_pushed(frame: str) -> bool:
        gate = json.loads(frame).get("gate") or {}
        return gate.get("namespace") == "rl-a" and gate.get("state") == "unknown"

    pushed = json.loads((await _frames_until(api_stream, unknown_pushed))[-1])["gate"]
    assert pushed["open"] is False and "listener unreachable" in pushed["reason"]
    rows = await _frames_until(page_stream, lambda f: 'data-state="unknown"' in f)
    assert 'hx-swap-oob="true"' in rows[-1] and ">unknown</span>" in rows[-1]

    stale = await asyncio.to_thread(_api_in_thread, viewer_client, source, "rl-a")
    assert stale["state"] == "unknown" and stale["open"] is False
    assert stale["reason"].startswith("source sim is stale: ")
    assert stale["since"] > before["since"] and stale["revision"] > before["revision"]
    assert stale["updated_at"] > before["updated_at"]
    # What was verified is still said: trainers see the set, just not that it admits.
    assert stale["verified_instances"] == before["verified_instances"]
    unknown = await database_sync_to_async(_notified)("gate.unknown")
    assert len(unknown) == 1 and len(unknown[0]["data"]["gates"]) == len(NAMESPACES)

    await asyncio.to_thread(_discover, source.pk, good_url)

    def reopened(frame: str) -> bool:
        gate = json.loads(frame).get("gate") or {}
        return gate.get("namespace") == "rl-a" and gate.get("state") == "open"

    await _frames_until(api_stream, reopened)
    await _frames_until(page_stream, lambda f: 'id="gate-' in f and 'data-state="open"' in f)
    back = await asyncio.to_thread(_api_in_thread, viewer_client, source, "rl-a")
    assert back["state"] == "open" and back["open"] is True and back["reason"] == ""
    assert back["since"] > stale["since"]
    assert back["verified_instances"] == before["verified_instances"]
    assert back["verified_version"] == before["verified_version"]
    actions = await database_sync_to_async(
        lambda: list(AuditEvent.objects.filter(action__in=["gate.unknown", "gate.known"]))
    )()
    assert sorted(e.action for e in actions) == ["gate.known"] * 3 + ["gate.unknown"] * 3
    for c in (api_stream, page_stream):
        await c.disconnect()


def _gate(source, namespace, state, **fields) -> Gate:
    return Gate.objects.create(source=source, namespace=namespace, state=state, **fields)


@pytest.fixture
def quiet_source(db):
    """A source with one gate in each state; its discovery last succeeded long ago."""
    source = Source.objects.create(
        name="quiet",
        listener_url="http://127.0.0.1:9/",
        allowed_networks=["127.0.0.0/8"],
        discovery_interval_seconds=10,
        last_success_at=timezone.now() - timedelta(minutes=10),
    )
    # The verified gate's workers are in the serving ledger, which the gate is a view of.
    verified = _gate(source, "verified", GateState.OPEN, verified_version="v1")
    admitted = {
        "version": "v1",
        "evidence": Evidence.VERIFIED_REFRESH,
        "admission": Admission.VERIFIED,
    }
    with transaction.atomic():
        ledger.write(source, {("verified", i): admitted for i in ("7", "11")}, cause="fixture")
        gates.project([verified.pk])
    _gate(
        source,
        "forced",
        GateState.OPEN_FORCED,
        reason="trainer deadline",
        forced_by="approver-1",
        forced_at=timezone.now() - timedelta(hours=1),
    )
    _gate(source, "held", GateState.CLOSED, reason="held: update failed")
    return source


def test_a_too_old_discovery_marks_gates_unknown_through_the_beat_task(quiet_source, celery_worker):
    schedule = settings.CELERY_BEAT_SCHEDULE["gate-freshness"]
    assert schedule["task"] == sync_gate_freshness.name
    assert schedule["schedule"] == timedelta(seconds=settings.DISCOVERY_TICK_SECONDS)
    _destination()

    sync_gate_freshness.delay()
    wait_for(lambda: not Gate.objects.filter(source=quiet_source, state__startswith="open"))
    states = dict(Gate.objects.filter(source=quiet_source).values_list("namespace", "state"))
    assert states == {"verified": "unknown", "forced": "unknown", "held": "closed"}
    body = Client()
    body.force_login(_viewer())
    seen = body.get("/api/v1/gates/quiet/verified").json()
    assert seen["open"] is False
    assert seen["reason"].startswith("source quiet is stale: no successful discovery since ")
    assert len(_notified("gate.unknown")) == 1

    # Discovery succeeds again: the next tick restores each gate to what it was.
    Source.objects.filter(pk=quiet_source.pk).update(last_success_at=timezone.now())
    sync_gate_freshness.delay()
    wait_for(lambda: not Gate.objects.filter(source=quiet_source, state="unknown"))
    forced = Gate.objects.get(source=quiet_source, namespace="forced")
    assert forced.state == GateState.OPEN_FORCED and forced.reason == "trainer deadline"
    assert forced.forced_by == "approver-1"
    verified = Gate.objects.get(source=quiet_source, namespace="verified")
    assert verified.state == GateState.OPEN and verified.verified_instances == ["7", "11"]
    assert Gate.objects.get(source=quiet_source, namespace="held").state == GateState.CLOSED
    assert [len(p["data"]["gates"]) for p in _notified("gate.opened")] == [2]


def _viewer():
    from controlplane.accounts.roles import Role
    from controlplane.accounts.services import create_user_with_role

    return create_user_with_role("viewer-x", Role.VIEWER, "pw-not-used-here-1", validate=False)


def test_fresh_enough_is_per_source_interval_with_a_floor(quiet_source, settings):
    from controlplane.refresh.freshness import source_is_unknown, stale_after

    settings.GATE_STALE_AFTER_SECONDS = 60
    settings.GATE_STALE_INTERVALS = 3
    now = timezone.now()
    quiet_source.discovery_interval_seconds = 10  # 3 x 10 s is under the 60 s floor
    assert stale_after(quiet_source) == timedelta(seconds=60)
    quiet_source.last_success_at = now - timedelta(seconds=50)
    assert not source_is_unknown(quiet_source, now)
    quiet_source.discovery_interval_seconds = 120
    quiet_source.last_success_at = now - timedelta(seconds=300)
    assert not source_is_unknown(quiet_source, now)  # 3 x 120 s
    quiet_source.last_success_at = now - timedelta(seconds=400)
    assert source_is_unknown(quiet_source, now)
    quiet_source.last_success_at = now
    quiet_source.stale = True  # a failing listener is unknown at once
    assert source_is_unknown(quiet_source, now)


def test_updated_at_moves_with_every_revision_and_since_only_with_the_state(
    quiet_source, viewer_client
):
    url = "/api/v1/gates/quiet/held"
    first = viewer_client.get(url)
    etag, body = first["ETag"], first.json()
    assert viewer_client.get(url, HTTP_IF_NONE_MATCH=etag).status_code == 304

    gate = Gate.objects.get(source=quiet_source, namespace="held")
    with transaction.atomic():
        gates._update([gate.pk], reason="held: still failing")  # same state, new words
    reworded = viewer_client.get(url, HTTP_IF_NONE_MATCH=etag)
    assert reworded.status_code == 200
    again = reworded.json()
    assert again["revision"] == body["revision"] + 1
    assert again["updated_at"] > body["updated_at"]
    assert again["since"] == body["since"]  # still closed: since stays

    with transaction.atomic():
        gates.force_open([gate], actor=Actor.system("test"), refresh=None, reason="go")
    opened = viewer_client.get(url, HTTP_IF_NONE_MATCH=reworded["ETag"]).json()
    assert opened["state"] == "open_forced"
    assert opened["since"] > again["since"] and opened["updated_at"] > again["updated_at"]
    assert opened["since"] == opened["updated_at"]


def test_force_reopen_shows_open_forced_with_its_reason_on_api_page_and_badges(
    quiet_source, approver_client, viewer_client
):
    gate = Gate.objects.get(source=quiet_source, namespace="held")
    response = approver_client.post(
        f"/refreshes/gates/{gate.pk}/force-reopen/", {"reason": "eval needs samples now"}
    )
    assert response.status_code == 302

    api = viewer_client.get("/api/v1/gates/quiet/held").json()
    assert api["state"] == "open_forced" and api["open"] is True
    assert api["forced"]["by"] == "approver-1"
    assert api["forced"]["reason"] == "eval needs samples now" and api["forced"]["at"]

    page = viewer_client.get("/refreshes/gates/").content.decode()
    row = page[page.index(f'id="gate-{gate.pk}"') :]
    row = row[: row.index("</tr>")]
    assert 'data-state="open_forced"' in row
    assert '<span class="badge forced">open (forced)</span>' in row
    assert "eval needs samples now" in row and "forced by approver-1 at " in row
    assert " UTC" in row and " ago</time>" in row

    # The fleet badges tell the four states apart; the forced one says so and why.
    overview = viewer_client.get("/").content.decode()
    badge = re.search(
        r'<span class="badge gate-open_forced forced" data-gate-state="open_forced" '
        r'title="([^"]*)">held open \(forced\)</span>',
        overview,
    )
    assert badge, overview
    assert badge[1].startswith("force-reopened by approver-1 at ")
    assert badge[1].endswith(" UTC: eval needs samples now")
    # The force-reopen's readback discovery found the listener unreachable: the source is
    # stale, so its verified gate is `unknown` now, never shown open.
    assert 'data-gate-state="unknown"' in overview
    assert 'class="badge gate-closed closed" data-gate-state="closed"' not in overview


@pytest.mark.usefixtures("release_async_resources")
async def test_force_reopen_reaches_both_gate_streams(quiet_source, approver, viewer):
    gate = await database_sync_to_async(Gate.objects.get)(source=quiet_source, namespace="held")
    api_stream = _communicator("/ws/gates/", viewer)
    page_stream = _communicator("/ws/gate-table/", viewer)
    for c in (api_stream, page_stream):
        assert (await c.connect())[0]
        await c.receive_from(timeout=10)
    await page_stream.receive_from(timeout=10)  # banner

    def force() -> None:
        try:
            client = Client()
            client.force_login(approver)
            client.post(f"/refreshes/gates/{gate.pk}/force-reopen/", {"reason": "go now"})
        finally:
            connections.close_all()

    await asyncio.to_thread(force)
    frame = json.loads((await _frames_until(api_stream, lambda f: "open_forced" in f))[-1])
    assert frame["event"] == "gate.changed"
    assert frame["gate"]["forced"] == {
        "by": "approver-1",
        "at": frame["gate"]["forced"]["at"],
        "reason": "go now",
        "instances": [],  # no live worker: nothing admitted that is not verified
    }
    row = (await _frames_until(page_stream, lambda f: f'id="gate-{gate.pk}"' in f))[-1]
    assert row.startswith("<tr ") and 'hx-swap-oob="true"' in row
    assert 'data-state="open_forced"' in row and "go now" in row and "approver-1" in row
    # A streamed row has no request behind it: it asks for its own action form.
    assert f'hx-get="/refreshes/gates/{gate.pk}/actions/"' in row
    for c in (api_stream, page_stream):
        await c.disconnect()


@pytest.mark.usefixtures("release_async_resources")
async def test_the_gate_table_stream_refuses_anonymous(quiet_source):
    from django.contrib.auth.models import AnonymousUser

    connected, code = await _communicator("/ws/gate-table/", AnonymousUser()).connect()
    assert not connected and code == 4403


def test_gate_actions_fragment_is_rendered_for_the_user(quiet_source, approver_client, client):
    gate = Gate.objects.get(source=quiet_source, namespace="held")
    url = f"/refreshes/gates/{gate.pk}/actions/"
    assert "Force-reopen" in approver_client.get(url).content.decode()
    from controlplane.accounts.roles import Role
    from controlplane.accounts.services import create_user_with_role

    client.force_login(create_user_with_role("v2", Role.VIEWER, "pw-x-1", validate=False))
    assert "Force-reopen" not in client.get(url).content.decode()
    open_gate = Gate.objects.get(source=quiet_source, namespace="verified")
    reply = approver_client.get(f"/refreshes/gates/{open_gate.pk}/actions/")
    assert "Force-reopen" not in reply.content.decode()


def test_metrics_count_gates_by_source_and_state(quiet_source, client):
    body = client.get("/metrics").content.decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
        if s.name == "controlplane_gates"
    }
    expected = {
        "open": 1,
        "open_mixed": 0,
        "open_forced": 1,
        "closed": 1,
        "unverified": 0,
        "unknown": 0,
    }
    assert samples == {
        ("controlplane_gates", (("source", "quiet"), ("state", state))): n
        for state, n in expected.items()
    }
