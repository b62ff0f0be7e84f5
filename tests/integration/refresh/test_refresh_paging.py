"""The refresh page at fleet scale: one page of the worker-by-step grid, constant queries, and a
live stream that sends only what changed on the page a client shows."""

from __future__ import annotations

import re

import pytest
from channels.db import database_sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.urls import reverse

from controlplane.audit.recorder import Actor
from controlplane.fleet import services
from controlplane.refresh import live, presenters
from controlplane.refresh.models import (
    JournalEntry,
    PlannedWorker,
    PolicyRefresh,
    RefreshState,
    WorkerStepResult,
)
from controlplane.refresh.routing import websocket_urlpatterns
from controlplane.refresh.step_order import WORKER_STEPS
from tests.fixtures.scale import make_refresh


@pytest.fixture
def source(db):
    return services.create_source(
        actor=Actor.system("test"),
        name="big",
        listener_url="http://10.0.0.5:8001",
        allowed_networks=["10.0.0.0/8"],
    )


ROW = re.compile(r'<tr id="worker-row-(\d+)">')
NEXT = re.compile(r'<a href="\?([^"]+)"[^>]*rel="next"')


def walk(client, url: str, query: str = "") -> list[int]:
    seen: list[int] = []
    while True:
        html = client.get(f"{url}?{query}").content.decode()
        seen += [int(pk) for pk in ROW.findall(html)]
        found = NEXT.search(html)
        if not found:
            return seen
        query = found.group(1).replace("&amp;", "&")


def test_refresh_page_query_count_is_the_same_at_10_and_2000_workers(
    source, operator_client, django_assert_max_num_queries
):
    small = make_refresh(source, 10)
    big = make_refresh(source, 2000)
    # Warm both pages: the session's caches, and each refresh's capacity chart, which a page
    # computes once and then shares through the cache (its own query count at 10 and 2,000
    # workers is asserted in test_refresh_capacity.py).
    operator_client.get(reverse("refresh:detail", args=[small.pk]))
    operator_client.get(reverse("refresh:detail", args=[big.pk]))
    with django_assert_max_num_queries(40) as at_10:
        operator_client.get(reverse("refresh:detail", args=[small.pk]))
    with django_assert_max_num_queries(len(at_10.captured_queries)) as at_2000:
        response = operator_client.get(reverse("refresh:detail", args=[big.pk]))
    assert len(at_2000.captured_queries) == len(at_10.captured_queries)
    assert response.content.decode().count('<tr id="worker-row-') == presenters.GRID_PAGE_SIZE


def test_first_screen_at_2000_workers_is_small_and_shows_the_grid_page(source, viewer_client):
    refresh = make_refresh(source, 2000)
    response = viewer_client.get(reverse("refresh:detail", args=[refresh.pk]))
    html = response.content.decode()
    assert len(response.content) < 250_000, len(response.content)
    assert html.count('<tr id="worker-row-') == 100
    assert html.count('data-status="running"') > 0 and html.count('data-status="ok"') > 100
    assert "1\u2013100 of 2000 · page 1 of 20" in html
    journal = html[html.index('id="journal-rows"') :]
    assert journal.count("<tr ") == presenters.JOURNAL_LIMIT


def test_paging_filter_and_search_reach_every_planned_worker(source, viewer_client):
    refresh = make_refresh(source, 450)
    url = reverse("refresh:detail", args=[refresh.pk])
    every = set(PlannedWorker.objects.filter(refresh=refresh).values_list("pk", flat=True))
    walked = walk(viewer_client, url)
    assert len(walked) == 450 and set(walked) == every
    rl2 = set(
        PlannedWorker.objects.filter(refresh=refresh, namespace="rl-2").values_list("pk", flat=True)
    )
    assert set(walk(viewer_client, url, "namespace=rl-2")) == rl2
    one = PlannedWorker.objects.filter(refresh=refresh).order_by("-pk").first()
    assert walk(viewer_client, url, f"q={one.instance_id}") == [one.pk]


def test_htmx_paging_returns_the_grid_with_a_stream_that_follows_the_page(source, viewer_client):
    refresh = make_refresh(source, 150)
    url = reverse("refresh:detail", args=[refresh.pk])
    html = viewer_client.get(url, {"page": "2"}, headers={"HX-Request": "true"}).content.decode()
    assert "<html" not in html and 'id="refresh-journal"' not in html
    assert html.count('<tr id="worker-row-') == 50
    assert f'ws-connect="/ws/refreshes/{refresh.pk}/?page=2&amp;seen_state=updating' in html


# -- the live stream -------------------------------------------------------------------------


def communicator(path: str, user) -> WebsocketCommunicator:
    c = WebsocketCommunicator(URLRouter(websocket_urlpatterns), path)
    c.scope["user"] = user
    return c


def _page_two(refresh: PolicyRefresh) -> tuple[list[int], str]:
    view = presenters.GridFilter(page=2)
    ids = [w.pk for w in view.page_of(refresh).object_list]
    return ids, presenters.stream_query(view, presenters.seen_marks(refresh))


def _running_update_cells(refresh: PolicyRefresh, ids: list[int]) -> list[int]:
    cells = presenters.cells_of(refresh, ids)
    return [pk for pk in ids if cells[pk][1].status == "running"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("release_async_resources")
async def test_a_page_drawn_just_now_gets_only_the_head_on_connect(source, viewer):
    refresh = await database_sync_to_async(make_refresh)(source, 250)
    _, query = await database_sync_to_async(_page_two)(refresh)
    c = communicator(f"/ws/refreshes/{refresh.pk}/?{query}", viewer)
    assert (await c.connect())[0]
    head = await c.receive_from(timeout=10)
    assert 'id="refresh-live" hx-swap-oob="true"' in head
    assert 'id="grid-rows"' not in head and "worker-row" not in head
    # A guard against anything table-sized riding along (50 worker rows of this fixture are
    # ~65 KB): the head's own size moves with its capacity chart, whose steps follow the
    # fixture's journal times (20.3 KB seen once in CI).
    assert len(head) < 32_000
    assert await c.receive_nothing(timeout=0.5)
    await c.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("release_async_resources")
async def test_progress_and_state_changes_send_only_what_changed_on_the_page(source, viewer):
    refresh = await database_sync_to_async(make_refresh)(source, 250)
    page_ids, query = await database_sync_to_async(_page_two)(refresh)
    c = communicator(f"/ws/refreshes/{refresh.pk}/?{query}", viewer)
    assert (await c.connect())[0]
    await c.receive_from(timeout=10)  # the head

    other = await database_sync_to_async(
        lambda: PlannedWorker.objects.filter(refresh=refresh).exclude(pk__in=page_ids).first().pk
    )()
    running = await database_sync_to_async(_running_update_cells)(refresh, page_ids)
    mine = running[0]  # shown "running": its update has not finished
    cell = {"step": "update", "status": "ok", "error": "", "ms": 20.0, "calls": []}
    await database_sync_to_async(WorkerStepResult.objects.create)(  # as the executor does
        refresh=refresh,
        planned_worker_id=mine,
        step="update",
        status="ok",
        duration_ms=20.0,
        finished_at=refresh.started_at,
    )
    await database_sync_to_async(live.publish_progress)(
        refresh.pk,
        "update",
        126,
        250,
        [{**cell, "worker": other}, {**cell, "worker": mine}],
    )
    frame = await c.receive_from(timeout=10)
    assert f'id="cell-{mine}-update"' in frame and f'id="cell-{other}-update"' not in frame
    assert 'id="progress-count"' in frame

    # Held: the update cells still "running" on this page turn back to "pending"; a new call
    # is journaled. The stream sends the head, those cells and that call: no table.
    def hold() -> None:
        worker = PlannedWorker.objects.get(pk=page_ids[3])
        JournalEntry.objects.create(
            refresh=refresh,
            planned_worker=worker,
            step="update",
            operation="update",
            method="POST",
            url="http://10.0.0.9:9000/engine/update_weights_from_disk",
            ok=False,
            error="HTTP 503 held-marker",
            duration_ms=3,
            started_at=refresh.started_at,
            finished_at=refresh.started_at,
            lease_token=1,
        )
        PolicyRefresh.objects.filter(pk=refresh.pk).update(
            state=RefreshState.HELD, failed_step="update", held_reason="update failed on 25"
        )
        live.publish_state(PolicyRefresh.objects.get(pk=refresh.pk))

    await database_sync_to_async(hold)()
    head = await c.receive_from(timeout=10)
    assert 'data-state="held"' in head and "update failed on 25" in head
    cells = await c.receive_from(timeout=10)
    # The cells shown "running" turn back to what their results say (pending, or failed).
    assert cells.count("<td ") == len(running) - 1 > 10
    assert 'data-status="running"' not in cells and 'data-status="pending"' in cells
    assert f'id="cell-{mine}-update"' not in cells  # it was sent ok already
    calls = await c.receive_from(timeout=10)
    assert calls.startswith('<tbody hx-swap-oob="afterbegin:#journal-rows">')
    assert calls.count("<tr ") == 1 and "held-marker" in calls
    rest = []
    while not await c.receive_nothing(timeout=0.5):
        rest.append(await c.receive_from(timeout=1))
    assert not any("worker-row" in f or 'id="grid-rows"' in f for f in rest)
    await c.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("release_async_resources")
async def test_a_stale_page_reconnecting_gets_its_grid_page_only(source, viewer):
    refresh = await database_sync_to_async(make_refresh)(source, 250)
    page_ids, query = await database_sync_to_async(_page_two)(refresh)
    await database_sync_to_async(
        lambda: PolicyRefresh.objects.filter(pk=refresh.pk).update(state=RefreshState.HELD)
    )()
    c = communicator(f"/ws/refreshes/{refresh.pk}/?{query}", viewer)
    assert (await c.connect())[0]
    await c.receive_from(timeout=10)
    grid = await c.receive_from(timeout=10)
    assert grid.startswith('<tbody id="grid-rows" hx-swap-oob="true">')
    assert sorted(int(pk) for pk in ROW.findall(grid)) == sorted(page_ids)
    assert grid.count("data-status=") == len(page_ids) * len(WORKER_STEPS)
    assert await c.receive_nothing(timeout=0.5)  # no new calls: no journal frame
    await c.disconnect()


def test_plan_preview_of_2000_workers_is_paged_too(source, viewer_client):
    refresh = make_refresh(source, 2000)
    PolicyRefresh.objects.filter(pk=refresh.pk).update(state=RefreshState.PLANNED)
    url = reverse("refresh:detail", args=[refresh.pk])
    response = viewer_client.get(url)
    html = response.content.decode()
    assert len(response.content) < 250_000, len(response.content)
    assert html.count('<ol class="plan-calls">') == 100
    assert "engine/update_weights_from_disk" in html  # the exact planned calls are shown
    partial = viewer_client.get(url, {"page": "20"}, headers={"HX-Request": "true"})
    body = partial.content.decode()
    assert body.lstrip().startswith('<div id="refresh-plan">')
    assert body.count('<ol class="plan-calls">') == 100 and "page 20 of 20" in body
