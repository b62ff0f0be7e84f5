"""The group long poll (`GET /api/v1/refreshes/<id>/group?wait=`) against a live uvicorn.

The server gets a pool of one connection (2 s to get it): a single poll holding its
connection while it waits, as the sync view did, would take the whole pool and make every
other request of the process fail. The caps are small (8 waits per token, 12 per process) so the
tests reach them, and the recheck is long (30 s) so an answer within seconds of a change is a
wake-up, not a timer.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from django.db import connection

from controlplane.accounts.tokens import create_token
from controlplane.audit.recorder import Actor
from controlplane.fleet.models import Source
from controlplane.refresh import handshake
from tests.fixtures.live_server import LIVE_SERVER_APPLICATION_NAME, asgi_server
from tests.fixtures.long_poll import broadcast_done, first_answer, make_scene, timed_reads
from tests.postgres import postgres_only

PER_TOKEN = 8
PER_PROCESS = 12
SERVER_ENV = {
    "DATABASE_POOL_MIN_SIZE": "1",
    "DATABASE_POOL_MAX_SIZE": "1",
    "DATABASE_POOL_TIMEOUT_SECONDS": "2",
    "LONG_POLL_MAX_WAITS_PER_TOKEN": str(PER_TOKEN),
    "LONG_POLL_MAX_WAITS_PER_PROCESS": str(PER_PROCESS),
    "LONG_POLL_RECHECK_SECONDS": "30",
}


@pytest.fixture(scope="module")
def _uvicorn(django_db_setup, tmp_path_factory):
    log = tmp_path_factory.mktemp("long-poll") / "uvicorn.log"
    with asgi_server(log, server="uvicorn", **SERVER_ENV) as url:
        yield url


@pytest.fixture
def server(_uvicorn, transactional_db) -> str:
    return _uvicorn


def server_connections_busy() -> int:
    """The live server's connections that are running a query or inside a transaction
    (run from another thread: closes its connection)."""
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                "AND state IS DISTINCT FROM 'idle'",
                [LIVE_SERVER_APPLICATION_NAME],
            )
            return cursor.fetchone()[0]
    finally:
        connection.close()


@postgres_only
def test_waiting_polls_hold_no_connection_respect_the_caps_and_are_woken(server):
    scene = make_scene(tokens=2)
    params = {"wait": 20, "after": handshake.READY}

    async def scenario():
        limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
        async with httpx.AsyncClient(base_url=server, limits=limits, timeout=40) as client:

            def poll(token: int) -> asyncio.Task[httpx.Response]:
                get = client.get(scene.group_url, params=params, headers=scene.auth(token))
                return asyncio.ensure_future(get)

            # One poll past the token's cap: the polls before it wait, so it answers first.
            first = [poll(0) for _ in range(PER_TOKEN + 1)]
            refused_token = await first_answer(first, within=10)
            # The second token fills the process: one more is refused for the server.
            second = [poll(1) for _ in range(PER_PROCESS - PER_TOKEN + 1)]
            refused_process = await first_answer(second, within=10)
            waiting = [t for t in first + second if not t.done()]
            # A plain read is never refused, and everything else answers while they wait.
            plain = await client.get(scene.group_url, headers=scene.auth(0))
            reads = await timed_reads(client, scene, rounds=2, readyz=False)
            busy = await asyncio.to_thread(server_connections_busy)
            assert not any(t.done() for t in waiting), "a poll answered before the change"
            changed_at = time.monotonic()
            await asyncio.to_thread(broadcast_done, scene.refresh.pk)
            answers = await asyncio.gather(*waiting)
            woken_in = time.monotonic() - changed_at
        return refused_token, refused_process, plain, reads, busy, waiting, answers, woken_in

    refused_token, refused_process, plain, reads, busy, waiting, answers, woken_in = asyncio.run(
        scenario()
    )
    for refused, whose in ((refused_token, "token"), (refused_process, "server")):
        assert refused.status_code == 429, refused.text
        assert refused.headers["Retry-After"].isdigit()
        error = refused.json()["error"]
        assert error["code"] == "throttled" and f"this {whose} has too many" in error["message"]
    assert plain.status_code == 200 and plain.json()["state"] == handshake.READY
    assert reads.errors == []
    print("while", len(waiting), "polls waited: median ms", reads.medians())
    assert busy == 0, "a server connection was busy while the polls only waited"
    assert len(waiting) == PER_PROCESS
    assert {a.status_code for a in answers} == {200}
    assert {a.json()["state"] for a in answers} == {handshake.BROADCAST_DONE}
    # Woken by the change, not by the 30 s recheck nor the 20 s deadline.
    assert woken_in < 10, woken_in


def test_a_poll_ends_at_its_deadline_with_the_state_unchanged(server):
    scene = make_scene()
    started = time.monotonic()
    answer = httpx.get(
        f"{server}{scene.group_url}",
        params={"wait": 1, "after": handshake.READY},
        headers=scene.auth(),
        timeout=20,
    )
    elapsed = time.monotonic() - started
    assert answer.status_code == 200, answer.text
    assert answer.json()["state"] == handshake.READY
    assert 1.0 <= elapsed < 5.0, elapsed


def test_a_poll_answers_at_once_when_the_state_already_moved(server):
    scene = make_scene()
    started = time.monotonic()
    answer = httpx.get(
        f"{server}{scene.group_url}",
        params={"wait": 20, "after": handshake.JOINING},
        headers=scene.auth(),
        timeout=20,
    )
    assert answer.status_code == 200 and answer.json()["state"] == handshake.READY
    assert time.monotonic() - started < 5


def test_a_long_poll_keeps_its_permissions(server):
    scene = make_scene()
    url = f"{server}{scene.group_url}"
    params = {"wait": 5, "after": handshake.READY}
    assert httpx.get(url, params=params, timeout=20).status_code == 401
    bad = httpx.get(url, params=params, headers={"Authorization": "Bearer cpt_x_y"}, timeout=20)
    assert bad.status_code == 401
    # A token limited to another source does not learn that this refresh exists.
    other = Source.objects.create(
        name="other", listener_url="http://127.0.0.1:9/", allowed_networks=["127.0.0.0/8"]
    )
    limited = {"Authorization": f"Bearer {create_limited_token(other)}"}
    hidden = httpx.get(url, params=params, headers=limited, timeout=20)
    assert hidden.status_code == 404, hidden.text
    missing = httpx.get(
        f"{server}/api/v1/refreshes/999999/group", params=params, headers=scene.auth(), timeout=20
    )
    assert missing.status_code == 404
    invalid = httpx.get(url, params={"wait": 61}, headers=scene.auth(), timeout=20)
    assert invalid.status_code == 422


def create_limited_token(source: Source) -> str:
    from controlplane.accounts.models import ApiToken

    user = ApiToken.objects.select_related("user").first().user
    return create_token(user=user, label="limited", actor=Actor.system(), sources=[source])[1]
