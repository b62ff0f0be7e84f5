"""`bench/_wsclient.py`, the lean websocket client `bench/ws_fanout.py` holds its subscribers
with: the figures of the gate stream's row rest on it counting every frame the server sent,
once. Against a real websockets server (the library uvicorn serves websockets with)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from websockets.asyncio.server import serve
from websockets.frames import Opcode

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import _wsclient  # bench/ is not a package: imported from its folder

#: One text message of each length encoding (7-bit, 16-bit, 64-bit) and a non-ASCII one.
MESSAGES = ["short", "m" * 300, "l" * 70_000, "gate ✓ open"]


async def _server(handler):
    server = await serve(handler, "127.0.0.1", 0, compression=None)
    port = server.sockets[0].getsockname()[1]
    return server, f"ws://127.0.0.1:{port}/ws/gates/?source=a"


async def test_every_text_message_arrives_once_whole_and_in_order():
    seen: dict[str, str] = {}

    async def handler(ws):
        seen["cookie"] = ws.request.headers.get("Cookie", "")
        seen["path"] = ws.request.path
        for text in MESSAGES:
            await ws.send(text)
        await ws.send(["frag", "mented"])  # one message in three frames
        await ws.wait_closed()

    server, url = await _server(handler)
    got: list[bytes] = []
    done = asyncio.Event()

    def on_text(data: bytes, at: float) -> None:
        got.append(data)
        if len(got) == len(MESSAGES) + 1:
            done.set()

    async with server:
        conn = await _wsclient.connect(url, {"Cookie": "sessionid=abc"}, on_text)
        await asyncio.wait_for(done.wait(), timeout=10)
        conn.close()
        await asyncio.wait_for(conn.closed, timeout=10)
    assert [g.decode() for g in got] == [*MESSAGES, "fragmented"]
    assert seen == {"cookie": "sessionid=abc", "path": "/ws/gates/?source=a"}


async def test_a_ping_is_answered_and_a_close_from_the_server_ends_the_connection():
    pong = asyncio.get_running_loop().create_future()

    async def handler(ws):
        waiter = await ws.ping(b"are you there")
        await asyncio.wait_for(waiter, timeout=10)  # resolves only on the matching pong
        pong.set_result(True)
        await ws.close(code=4401, reason="go away")

    server, url = await _server(handler)
    async with server:
        conn = await _wsclient.connect(url, {}, lambda data, at: None)
        await asyncio.wait_for(conn.closed, timeout=10)
    assert pong.result() is True
    assert conn.close_code == 4401


async def test_a_refused_upgrade_is_an_error_not_a_hang():
    async def handler(ws):  # never reached: the request is refused before the upgrade
        await ws.close()

    def refuse(connection, request):
        return connection.respond(403, "no\n")

    server = await serve(handler, "127.0.0.1", 0, process_request=refuse)
    port = server.sockets[0].getsockname()[1]
    async with server:
        with pytest.raises(ConnectionError, match="upgrade refused"):
            await _wsclient.connect(f"ws://127.0.0.1:{port}/", {}, lambda data, at: None)


def test_client_frames_are_masked_and_unmask_to_the_payload():
    frame = _wsclient._client_frame(Opcode.PONG.value, b"x" * 200)
    assert frame[0] == 0x80 | Opcode.PONG.value
    assert frame[1] & 0x80  # the mask bit
    size = int.from_bytes(frame[2:4], "big")
    mask, body = frame[4:8], frame[8:]
    assert size == 200 and len(body) == 200
    assert bytes(b ^ mask[i % 4] for i, b in enumerate(body)) == b"x" * 200
