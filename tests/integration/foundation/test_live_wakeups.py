"""Wake-ups for waiting requests (`controlplane.realtime.wakeup`) over the real Redis channel
layer: one subscription per group however many wait, woken only by the events they name."""

from __future__ import annotations

import asyncio

import pytest
from channels.layers import get_channel_layer

from controlplane.realtime.wakeup import process_wakeups

pytestmark = pytest.mark.usefixtures("release_async_resources")


def event(name: str) -> dict:
    return {"type": "stream.event", "event": name, "payload": {}, "id": "t.1"}


async def test_every_watch_of_a_group_shares_one_subscription_and_wakes_on_its_events():
    wakeups = process_wakeups()
    layer = get_channel_layer()
    async with (
        wakeups.watch("refresh.901", frozenset({"group", "state"})) as first,
        wakeups.watch("refresh.901", frozenset({"group", "state"})) as second,
    ):
        assert list(wakeups.feeds) == ["refresh.901"]
        await layer.group_send("refresh.901", event("progress"))  # not theirs: sleeps on
        assert not await first.wait(0.3)
        await layer.group_send("refresh.901", event("group"))
        assert await first.wait(5) and await second.wait(5)
        assert not await first.wait(0.2)  # cleared once seen
        await layer.group_send("refresh.902", event("group"))  # another refresh
        assert not await second.wait(0.3)
    assert wakeups.feeds == {}  # the last watch leaving ends the subscription


async def test_a_watch_times_out_when_nothing_happens():
    async with process_wakeups().watch("refresh.903") as watch:
        started = asyncio.get_running_loop().time()
        assert not await watch.wait(0.3)
        assert asyncio.get_running_loop().time() - started >= 0.3
