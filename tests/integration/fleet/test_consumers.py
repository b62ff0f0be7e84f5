"""The live fleet streams over a real Redis channel layer."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser

from controlplane.fleet.discovery import run_discovery
from controlplane.fleet.models import DiscoveryTrigger, Worker, WorkerState
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
    run_discovery(source.pk, trigger=DiscoveryTrigger.MANUAL)
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
    await database_sync_to_async(run_discovery)(prefilled.pk, trigger=DiscoveryTrigger.MANUAL)

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
    await database_sync_to_async(run_discovery)(prefilled.pk, trigger=DiscoveryTrigger.MANUAL)

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
    await database_sync_to_async(run_discovery)(prefilled.pk, trigger=DiscoveryTrigger.MANUAL)
    frame = await _receive_until(communicator, lambda f: "1 gone" in f)
    assert 'hx-swap-oob="true"' in frame and "3 live" in frame
    await communicator.disconnect()


# -- a paged view: only the rows the client shows travel --------------------------------------


def _bulk_fleet(source, n: int) -> list[int]:
    from django.utils import timezone

    from controlplane.fleet.models import WorkerState

    now = timezone.now()
    Worker.objects.bulk_create(
        Worker(
            source=source,
            namespace=f"rl-{i % 2}",
            component="backend",
            endpoint="generate",
            instance_id=str(1000 + i),
            routes=["pause_generation"],
            weight_version="v1",
            state=WorkerState.LIVE,
            first_seen_at=now,
            last_seen_at=now,
        )
        for i in range(n)
    )
    # identity order: namespace, then numeric instance id
    return list(
        Worker.objects.filter(source=source)
        .order_by("namespace", "instance_id")
        .values_list("pk", flat=True)
    )


@pytest.fixture
def big_source(db):
    from controlplane.audit.recorder import Actor
    from controlplane.fleet import services

    return services.create_source(
        actor=Actor.system("test"),
        name="big",
        listener_url="http://10.0.0.5:8001",
        allowed_networks=["10.0.0.0/8"],
    )


def _change(pks: list[int], **fields) -> None:
    from controlplane.fleet import live

    Worker.objects.filter(pk__in=pks).update(**fields)
    live.publish_refresh(Worker.objects.get(pk=pks[0]).source_id, pks)


async def test_a_state_change_pushes_the_summary_and_only_the_changed_row_on_the_page(
    big_source, viewer
):
    pks = await database_sync_to_async(_bulk_fleet)(big_source, 400)
    rl1 = pks[200:]  # the rl-1 half, identity order
    c = _communicator(f"/ws/fleet/sources/{big_source.pk}/?namespace=rl-1&page=2", viewer)
    assert (await c.connect())[0]
    await c.receive_from(timeout=10)
    table = await c.receive_from(timeout=10)
    assert table.count('<tr id="worker-') == 100  # the visible page only, not 400
    on_page, off_page, other_ns = rl1[150], rl1[10], pks[5]
    assert f'id="worker-{on_page}"' in table and f'id="worker-{off_page}"' not in table

    from controlplane.fleet.models import WorkerState

    await database_sync_to_async(_change)(
        [on_page, off_page, other_ns], state=WorkerState.ERRORING, error="boom"
    )
    head = await c.receive_from(timeout=10)
    assert 'id="source-summary" hx-swap-oob="true"' in head and "3 erroring" in head
    assert "<tbody" not in head and "<tr" not in head
    row = await c.receive_from(timeout=10)
    assert row.startswith(f'<tr hx-swap-oob="true" id="worker-{on_page}"')
    assert row.count("<tr ") == 1 and "boom" in row
    assert await c.receive_nothing(timeout=0.5)  # page 1's row and rl-0's never come
    await c.disconnect()


async def test_a_newcomer_beyond_a_full_page_brings_a_notice_not_a_row(big_source, viewer):
    pks = await database_sync_to_async(_bulk_fleet)(big_source, 250)
    c = _communicator(f"/ws/fleet/sources/{big_source.pk}/", viewer)  # page 1 of 3, full
    assert (await c.connect())[0]
    await c.receive_from(timeout=10)
    await c.receive_from(timeout=10)
    outside = pks[-1]  # on page 3
    await database_sync_to_async(_change)([outside], weight_version="v2")
    head = await c.receive_from(timeout=10)
    assert 'id="workers-notice"' in head and "on other pages" in head
    assert await c.receive_nothing(timeout=0.5)
    await c.disconnect()


async def test_a_gate_change_pushes_the_summary_and_no_table(big_source, viewer):
    from controlplane.refresh.live import announce_to_fleet_pages

    await database_sync_to_async(_bulk_fleet)(big_source, 120)
    c = _communicator(f"/ws/fleet/sources/{big_source.pk}/", viewer)
    assert (await c.connect())[0]
    await c.receive_from(timeout=10)
    await c.receive_from(timeout=10)
    await database_sync_to_async(announce_to_fleet_pages)({big_source.pk})
    frame = await c.receive_from(timeout=10)
    assert 'id="source-summary" hx-swap-oob="true"' in frame
    assert "<tr" not in frame and "<tbody" not in frame and len(frame) < 20_000
    assert await c.receive_nothing(timeout=0.5)
    await c.disconnect()


def _announce_counting_queries(source_ids: set[int]) -> int:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from controlplane.refresh.live import announce_to_fleet_pages

    with CaptureQueriesContext(connection) as queries:
        announce_to_fleet_pages(source_ids)
    return len(queries.captured_queries)


async def test_an_announced_change_is_rendered_by_the_receiving_streams_not_the_publisher(
    big_source, viewer
):
    """A refresh's executor announces each state change; the card and the summary are
    rendered where they are received, so announcing runs no query at all."""
    await database_sync_to_async(_bulk_fleet)(big_source, 30)
    overview = _communicator("/ws/fleet/", viewer)
    page = _communicator(f"/ws/fleet/sources/{big_source.pk}/", viewer)
    for c in (overview, page):
        assert (await c.connect())[0]
    await overview.receive_from(timeout=10)
    await page.receive_from(timeout=10)
    await page.receive_from(timeout=10)
    await database_sync_to_async(
        lambda: Worker.objects.filter(source=big_source).update(state=WorkerState.ERRORING)
    )()
    assert await database_sync_to_async(_announce_counting_queries)({big_source.pk}) == 0
    card = await overview.receive_from(timeout=10)
    assert f'id="source-card-{big_source.pk}" hx-swap-oob="true"' in card
    assert "30 erroring" in card
    summary = await page.receive_from(timeout=10)
    assert 'id="source-summary" hx-swap-oob="true"' in summary and "30 erroring" in summary
    for c in (overview, page):
        assert await c.receive_nothing(timeout=0.5)
        await c.disconnect()


async def test_a_big_refresh_re_reads_the_visible_page_only(big_source, viewer):
    from controlplane.fleet.live import LIVE_ROW_LIMIT

    pks = await database_sync_to_async(_bulk_fleet)(big_source, LIVE_ROW_LIMIT + 50)
    c = _communicator(f"/ws/fleet/sources/{big_source.pk}/?page=2", viewer)
    assert (await c.connect())[0]
    await c.receive_from(timeout=10)
    await c.receive_from(timeout=10)
    await database_sync_to_async(_change)(pks, error="restarted")
    await c.receive_from(timeout=10)  # summary and timeline
    table = await c.receive_from(timeout=10)
    assert table.startswith('<tbody id="worker-rows" hx-swap-oob="true">')
    assert table.count('<tr id="worker-') == 100 and table.count("restarted") == 100
    await c.disconnect()


def test_a_discovery_run_announces_its_source_and_ships_only_the_rows_it_touched(
    big_source, monkeypatch
):
    """The run renders its touched rows once; the card, summary, timeline and charts are left
    to each receiving process (a plan's discovery does not wait for pages nobody may watch)."""
    from controlplane.fleet import live

    sent: list[tuple[str, str, dict]] = []
    monkeypatch.setattr(live, "publish", lambda group, event, p: sent.append((group, event, p)))
    rendered: list[str] = []
    for name in (
        "card_html",
        "summary_html",
        "timeline_html",
        "source_charts_html",
        "overview_charts_html",
    ):
        monkeypatch.setattr(live, name, lambda *a, _n=name, **k: rendered.append(_n) or "")
    pks = _bulk_fleet(big_source, 4)

    live.publish_refresh(big_source.pk, pks[:2])

    assert rendered == []
    assert [event for _, event, _ in sent] == [
        live.EVENT_DISCOVERY_FINISHED,
        live.EVENT_CHARTS_CHANGED,
        live.EVENT_WORKERS_CHANGED,
    ]
    assert len({payload["stamp"] for _, _, payload in sent}) == 1
    workers = sent[-1][2]
    assert sent[-1][0] == live.source_group(big_source.pk) and workers["workers_moved"]
    assert sorted(row["id"] for row in workers["rows"]) == sorted(pks[:2])


async def test_the_overview_renders_an_announced_card_and_chart_once_per_process(
    big_source, viewer
):
    from controlplane.fleet import live

    await database_sync_to_async(_bulk_fleet)(big_source, 3)
    first, second = (_communicator("/ws/fleet/", viewer) for _ in range(2))
    for c in (first, second):
        assert (await c.connect())[0]
        await c.receive_from(timeout=10)
    live.shared_source_html.cache_clear()
    live.shared_overview_charts_html.cache_clear()
    pks = await database_sync_to_async(
        lambda: list(Worker.objects.filter(source=big_source).values_list("pk", flat=True))
    )()
    await database_sync_to_async(live.publish_refresh)(big_source.pk, pks)
    for c in (first, second):
        card = await c.receive_from(timeout=10)
        assert 'id="source-card-' in card and "big" in card
        chart = await c.receive_from(timeout=10)
        assert "version" in chart.lower()
    assert live.shared_source_html.cache_info().misses == 1  # the card
    assert live.shared_overview_charts_html.cache_info().misses == 1
    for c in (first, second):
        await c.disconnect()
