"""`ws/inbox/` over the real Redis channel layer: only people who may approve connect; the
first frame is their count, and a refresh entering or leaving `awaiting_approval` pushes the
new one (four eyes: a refresh you requested does not count)."""

from __future__ import annotations

import asyncio
import json

import pytest
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser
from django.db import connections

from controlplane.audit.recorder import Actor
from controlplane.realtime.streams import REFUSED
from controlplane.refresh import intents
from controlplane.refresh.models import PolicyRefresh, RefreshState
from controlplane.refresh.routing import websocket_urlpatterns
from tests.integration.refresh.test_refresh_list_page import _refresh, _source

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("release_async_resources"),
]


def _communicator(user) -> WebsocketCommunicator:
    c = WebsocketCommunicator(URLRouter(websocket_urlpatterns), "/ws/inbox/")
    c.scope["user"] = user
    return c


async def _count(c, timeout: float = 10.0) -> int:
    return json.loads(await c.receive_from(timeout=timeout))["count"]


async def test_who_may_not_approve_is_refused(viewer, operator):
    for user in (AnonymousUser(), viewer, operator):
        connected, code = await _communicator(user).connect()
        assert (connected, code) == (False, REFUSED), user


def _in_thread(fn) -> None:
    try:
        fn()
    finally:
        connections.close_all()


async def test_count_follows_approvals_for_this_approver_only(approver, operator):
    sim = await asyncio.to_thread(_source, "sim")
    await asyncio.to_thread(_refresh, sim, RefreshState.AWAITING_APPROVAL, by=approver)  # own
    c = _communicator(approver)
    assert (await c.connect())[0]
    assert await _count(c) == 0

    def awaiting_from_operator() -> None:
        planned = _refresh(sim, RefreshState.PLANNED, by=operator)
        intents.start_policy_refresh(
            PolicyRefresh.objects.select_related("source").get(pk=planned.pk),
            actor=Actor.for_user(operator),
            enqueue=False,
            require_approval=True,
        )

    await asyncio.to_thread(_in_thread, awaiting_from_operator)
    assert await _count(c) == 1  # pushed; the browser test times it (test_inbox_live.py)

    def reject_it() -> None:
        waiting = PolicyRefresh.objects.get(
            state=RefreshState.AWAITING_APPROVAL, requested_by=operator
        )
        intents.reject_policy_refresh(waiting, actor=Actor.for_user(approver), reason="no")

    await asyncio.to_thread(_in_thread, reject_it)
    assert await _count(c) == 0
    await c.disconnect()
