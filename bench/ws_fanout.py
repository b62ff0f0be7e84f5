"""Live push to many websocket subscribers: publish→receipt latency and messages lost.

    DATABASE_URL=postgres://... REDIS_URL=redis://... .venv/bin/python bench/ws_fanout.py \\
        [--subscribers 500 2000] [--runs 5] [--events 20] [--interval 0.25] \\
        [--workers 2] [--clients 2] [--stream fleet|gates] [--profile FILE] \\
        [--subscriber-client lean|aiohttp]

The real ASGI app runs under uvicorn (`--workers` processes, DEBUG off) on a throwaway
PostgreSQL database and the real Redis channel layer. `--clients` processes hold the
subscribers: websockets authenticated with a viewer's session cookie, on a real stream — the
fleet overview (`/ws/fleet/`, the source-card push a refresh makes) or the gate stream
(`/ws/gates/`). Their client is `bench/_wsclient.py` by default: it parses frames in the
protocol's callback, so the harness's own cost per frame, on the cores the server shares,
stays small. `--subscriber-client aiohttp` holds them with aiohttp's client instead, the
cross-check that both count the same frames. A separate publisher process calls
`controlplane.realtime.publish` as a Celery task would, `--events` times per run, one every
`--interval` seconds (default 4 a second: the most one coalesced progress stream sends), each
payload carrying the wall-clock time just before the call; a subscriber's latency is its
receipt time minus that.
Each run connects every subscriber afresh (they resync from the database, as a page does),
publishes, waits for the frames (at most 10 s after the last publish) and closes. Frames are
counted per subscriber and per event (the resync frame is never counted): lost is the
(subscriber, event) pairs never received, over connected subscribers only; duplicated is the
frames beyond the first of an event on one subscriber. Neither can hide the other.

`--profile FILE` runs the server as one uvicorn worker under cProfile (pass `--workers 1`) and
writes its stats to FILE when the bench ends (`python -m pstats FILE`).

Prints per run: connected, connect time, frames received per subscriber (expected, min, max),
lost, duplicated (with a few of the repeated frames: event, gate, revision), latency
p50/p95/max, the slowest publish() call, and the CPU per frame received of the server and of
the subscriber processes (they share the machine's cores with the server, so their own cost
is part of what delays a frame here); then min/median/max over the runs, and one
summary line per subscriber count against the goal (every subscriber connected, 0 lost,
0 duplicated, p95 < 250 ms).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import re
import resource
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

# _servers configures the bench process on import: DEBUG off, a Redis prefix of its own.
from _servers import (
    cpu_seconds,
    process_tree,
    server_database_url,
    session_cookie,
    start_uvicorn,
    throwaway_database,
)

APPLICATION_NAME = "cp-bench-ws-fanout"
GOAL_P95_MS = 250.0
#: How long after the last publish a run waits for frames still on their way.
RECEIVE_GRACE_SECONDS = 10.0
CONNECT_CONCURRENCY = 64
MARK = re.compile(rb"bench-(\d+)-(\d+)-(\d+\.\d+)")

#: stream name -> (websocket path, group, event); payloads from `_payload`
STREAMS = {
    "fleet": ("/ws/fleet/", "fleet", "fleet.discovery_finished"),
    "gates": ("/ws/gates/", "gates", "gate.changed"),
}


def _payload(stream: str, mark: str) -> dict:
    from controlplane.fleet.models import Source

    if stream == "fleet":
        # What fleet.live.publish_refresh sends: the source's id and a stamp; each web process
        # renders its card once for all its subscribers. So each event is a real source named
        # by the mark (its card shows the name), written just before it is announced.
        source = Source.objects.create(name=mark, listener_url="http://127.0.0.1:9/")
        return {"source_id": source.pk, "stamp": mark}
    # The gate stream sends the gate as committed, read by its (source, namespace), whatever
    # the push carried: so each event is a real gate row whose namespace is the mark, written
    # just before it is announced (the write is inside the measured latency, a few ms).
    from controlplane.refresh.models import Gate

    source, _ = Source.objects.get_or_create(
        name="bench-gates",
        defaults={"listener_url": "http://127.0.0.1:9/", "allowed_networks": ["127.0.0.0/8"]},
    )
    Gate.objects.create(source=source, namespace=mark)
    return {"source": source.name, "source_id": source.pk, "namespace": mark}


def _raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


# -- the subscriber processes ---------------------------------------------------------------


class Subscribers:
    """`count` websockets in one process, each counting the marked frames it receives: per
    socket, so a frame received twice (or one of another run) is seen, never netted out
    against a lost one.

    `client` is "lean" (`_wsclient`: frames parsed in the protocol's callback, the default)
    or "aiohttp" (aiohttp's websocket client, a reader task per socket). Both count the same
    frames; the lean one costs the shared cores less per frame (see `_wsclient`)."""

    def __init__(self, url: str, cookie: str, count: int, client: str = "lean") -> None:
        self.url, self.cookie, self.count, self.client = url, cookie, count, client
        self.sockets: list = []
        self.readers: list[asyncio.Task] = []
        #: run -> one Counter per socket: mark -> frames carrying it
        self.marks: dict[int, list[Counter]] = {}
        #: run -> distinct (socket, mark) pairs received, to know when all have arrived
        self.distinct: Counter = Counter()
        self.latencies: dict[int, list[float]] = {}
        #: run -> a few frames that repeated a mark already received on their socket
        self.repeats: dict[int, list[str]] = {}
        self.closed_early = 0
        self._closing = False

    async def connect(self) -> dict:
        gate = asyncio.Semaphore(CONNECT_CONCURRENCY)
        errors: Counter = Counter()
        started = time.perf_counter()
        one = self._connect_lean if self.client == "lean" else self._connect_aiohttp
        if self.client == "aiohttp":
            import aiohttp

            self.http = aiohttp.ClientSession(
                headers={"Cookie": self.cookie},
                connector=aiohttp.TCPConnector(limit=0),
                timeout=aiohttp.ClientTimeout(total=None),
            )

        async def guarded() -> None:
            async with gate:
                try:
                    await one(errors)
                except Exception as exc:
                    errors[type(exc).__name__] += 1

        await asyncio.gather(*(guarded() for _ in range(self.count)))
        return {
            "connected": len(self.sockets),
            "errors": dict(errors),
            "seconds": time.perf_counter() - started,
        }

    async def _connect_lean(self, errors: Counter) -> None:
        from _wsclient import connect

        index = -1  # a socket's index is taken once its resync has arrived (below)
        resynced = asyncio.get_running_loop().create_future()

        def on_text(data: bytes, at: float) -> None:
            if not resynced.done():
                resynced.set_result(None)  # the resync: never counted
                return
            self._on_text(index, data, at)

        ws = await connect(self.url, {"Cookie": self.cookie}, on_text)
        try:
            async with asyncio.timeout(120):
                await asyncio.wait({resynced, ws.closed}, return_when=asyncio.FIRST_COMPLETED)
        except TimeoutError:
            ws.abort()
            raise
        if not resynced.done():
            errors[f"closed {ws.close_code}"] += 1
            return
        index = len(self.sockets)  # on_text sees this binding: no frame is counted before it
        self.sockets.append(ws)
        self.readers.append(asyncio.ensure_future(self._watch_lean(ws)))

    async def _watch_lean(self, ws) -> None:
        await ws.closed
        if not self._closing:
            self.closed_early += 1

    async def _connect_aiohttp(self, errors: Counter) -> None:
        import aiohttp

        ws = await self.http.ws_connect(self.url, autoping=True, heartbeat=None)
        first = await ws.receive(timeout=120)  # the resync: never counted
        if first.type != aiohttp.WSMsgType.TEXT:
            errors[f"closed {ws.close_code}"] += 1
            await ws.close()
            return
        index = len(self.sockets)
        self.sockets.append(ws)
        self.readers.append(asyncio.create_task(self._read_aiohttp(ws, index)))

    async def _read_aiohttp(self, ws, index: int) -> None:
        import aiohttp

        async for message in ws:
            if message.type == aiohttp.WSMsgType.TEXT:
                self._on_text(index, message.data.encode(), time.time())
        if not self._closing:
            self.closed_early += 1

    def _counter(self, run: int, index: int) -> Counter:
        per_socket = self.marks.setdefault(run, [])
        while len(per_socket) <= index:
            per_socket.append(Counter())
        return per_socket[index]

    def _on_text(self, index: int, data: bytes, now: float) -> None:
        for run_text, seq, sent in MARK.findall(data):
            run = int(run_text)
            seen = self._counter(run, index)
            mark = (seq, sent)
            seen[mark] += 1
            if seen[mark] == 1:
                self.distinct[run] += 1
                self.latencies.setdefault(run, []).append(now - float(sent))
            elif len(self.repeats.setdefault(run, [])) < 5:
                self.repeats[run].append(f"socket {index}: {_describe(data.decode())}")

    async def expect(self, run: int, events: int, deadline: float) -> dict:
        wanted = events * len(self.sockets)
        while self.distinct[run] < wanted and time.time() < deadline:
            await asyncio.sleep(0.05)
        per_socket = self.marks.pop(run, [])
        counts = [sum(c.values()) for c in per_socket]
        counts += [0] * (len(self.sockets) - len(counts))  # sockets that received nothing
        return {
            "distinct": sum(len(c) for c in per_socket),
            "frames": sum(counts),
            "per_socket_min": min(counts, default=0),
            "per_socket_max": max(counts, default=0),
            "repeats": self.repeats.pop(run, []),
            "latencies": self.latencies.pop(run, []),
            "closed_early": self.closed_early,
        }

    async def close(self) -> None:
        self._closing = True
        if self.client == "lean":
            for ws in self.sockets:
                ws.close()
            if self.sockets:
                await asyncio.wait([ws.closed for ws in self.sockets], timeout=30)
            for ws in self.sockets:
                if not ws.closed.done():
                    ws.abort()
        else:
            await asyncio.gather(*(ws.close() for ws in self.sockets), return_exceptions=True)
            await self.http.close()
        await asyncio.gather(*self.readers, return_exceptions=True)
        self.sockets, self.readers = [], []


def _describe(frame: str) -> str:
    """What a repeated frame carried: its event, and for a gate its namespace and revision."""
    import json

    try:
        data = json.loads(frame)
    except ValueError:
        return frame[:120]
    gate = data.get("gate") if isinstance(data, dict) else None
    if isinstance(gate, dict):
        return f"{data.get('event')} {gate.get('namespace')} revision {gate.get('revision')}"
    return frame[:120]


def _subscriber_process(url: str, cookie: str, count: int, client: str, conn) -> None:
    _raise_fd_limit()

    async def main() -> None:
        subs = None
        while True:
            command, *args = await asyncio.to_thread(conn.recv)
            if command == "connect":
                subs = Subscribers(url, cookie, count, client)
                conn.send(await subs.connect())
            elif command == "expect":
                assert subs is not None
                conn.send(await subs.expect(*args))
            elif command == "close":
                assert subs is not None
                await subs.close()
                conn.send("closed")
            else:
                return

    # uvloop, as the server runs (uvicorn[standard] brings it): the standard loop's Python
    # selector costs the subscribers several microseconds per socket woken.
    import uvloop

    uvloop.run(main())


# -- the publisher process ------------------------------------------------------------------


def _publisher_process(stream: str, conn) -> None:
    import django

    django.setup()
    from controlplane import realtime

    _path, group, event = STREAMS[stream]
    while True:
        command, *args = conn.recv()
        if command == "forget":
            # The run's frames are in: its marked sources (and gates) go, so the next run's
            # subscribers resync an overview of the same size as this one's did.
            from controlplane.fleet.models import Source
            from controlplane.refresh.models import Gate

            Source.objects.filter(name__startswith="bench-", gates__isnull=True).delete()
            Gate.objects.filter(source__name="bench-gates").delete()
            conn.send("forgotten")
            continue
        if command != "publish":
            return
        run, events, interval = args
        calls = []
        next_at = time.monotonic()
        for seq in range(events):
            payload = _payload(stream, f"bench-{run}-{seq}-{time.time():.6f}")
            started = time.perf_counter()
            realtime.publish(group, event, payload)
            calls.append(time.perf_counter() - started)
            next_at += interval
            time.sleep(max(0.0, next_at - time.monotonic()))
        flushed = realtime.flush(RECEIVE_GRACE_SECONDS)
        conn.send({"slowest_call": max(calls), "flushed": flushed, "last_at": time.time()})


# -- the bench ------------------------------------------------------------------------------


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _spread(values: list[float], fmt: str = "{:.0f}") -> str:
    return (
        f"median {fmt.format(statistics.median(values))} "
        f"(min {fmt.format(min(values))}, max {fmt.format(max(values))})"
    )


def one_run(
    run: int, clients: list, publisher, server_pids: list[int], client_pids: list[int], args
) -> dict:
    for conn in clients:
        conn.send(("connect",))
    connects = [conn.recv() for conn in clients]
    connected = sum(c["connected"] for c in connects)
    errors: Counter = Counter()
    for c in connects:
        errors.update(c["errors"])
    cpu_before = cpu_seconds(server_pids)
    clients_cpu_before = cpu_seconds(client_pids)
    load_before = os.getloadavg()[0]
    publisher.send(("publish", run, args.events, args.interval))
    published = publisher.recv()
    deadline = published["last_at"] + RECEIVE_GRACE_SECONDS
    for conn in clients:
        conn.send(("expect", run, args.events, deadline))
    results = [conn.recv() for conn in clients]
    server_cpu = cpu_seconds(server_pids) - cpu_before
    clients_cpu = cpu_seconds(client_pids) - clients_cpu_before
    for conn in clients:
        conn.send(("close",))
        conn.recv()
    publisher.send(("forget",))
    publisher.recv()
    latencies = [ms * 1000 for r in results for ms in r["latencies"]]
    received = sum(r["frames"] for r in results)
    distinct = sum(r["distinct"] for r in results)
    return {
        "connected": connected,
        "connect_s": max(c["seconds"] for c in connects),
        "errors": dict(errors),
        "lost": connected * args.events - distinct,
        "duplicated": received - distinct,
        "per_subscriber": (
            min(r["per_socket_min"] for r in results),
            max(r["per_socket_max"] for r in results),
        ),
        "repeats": [line for r in results for line in r["repeats"]][:5],
        "closed_early": sum(r["closed_early"] for r in results),
        "p50": _percentile(latencies, 0.50),
        "p95": _percentile(latencies, 0.95),
        "max": max(latencies, default=float("nan")),
        "slowest_call_ms": published["slowest_call"] * 1000,
        "flushed": published["flushed"],
        "server_us_per_frame": server_cpu * 1e6 / max(1, received),
        "clients_us_per_frame": clients_cpu * 1e6 / max(1, received),
        "load": load_before,
    }


def bench(subscribers: int, url: str, cookie: str, server_pids: list[int], args) -> list[dict]:
    ctx = multiprocessing.get_context("spawn")  # no Django state, sockets or threads inherited
    path = STREAMS[args.stream][0]
    ws_url = url.replace("http://", "ws://") + path
    base, extra = divmod(subscribers, args.clients)
    shares = [base + (i < extra) for i in range(args.clients)]
    pipes, processes = [], []
    for share in shares:
        parent, child = ctx.Pipe()
        p = ctx.Process(
            target=_subscriber_process,
            args=(ws_url, cookie, share, args.subscriber_client, child),
        )
        p.start()
        pipes.append(parent)
        processes.append(p)
    subscriber_processes = list(processes)
    pub_parent, pub_child = ctx.Pipe()
    pub = ctx.Process(target=_publisher_process, args=(args.stream, pub_child))
    pub.start()
    processes.append(pub)
    results = []
    try:
        for run in range(1, args.runs + 1):
            r = one_run(
                run, pipes, pub_parent, server_pids, [p.pid for p in subscriber_processes], args
            )
            results.append(r)
            low, high = r["per_subscriber"]
            print(
                f"  N={subscribers} run {run}: connected {r['connected']}/{subscribers} in "
                f"{r['connect_s']:.1f} s; frames received per subscriber: expected "
                f"{args.events}, got min {low} / max {high}; lost {r['lost']}, duplicated "
                f"{r['duplicated']}; latency p50 {r['p50']:.0f} ms, "
                f"p95 {r['p95']:.0f} ms, max {r['max']:.0f} ms; slowest publish() "
                f"{r['slowest_call_ms']:.2f} ms; "
                f"server CPU {r['server_us_per_frame']:.0f} us/frame, subscribers' "
                f"{r['clients_us_per_frame']:.0f} us/frame; "
                f"errors {r['errors'] or 0}, closed early {r['closed_early']}; "
                f"load average {r['load']:.1f}",
                flush=True,
            )
            for line in r["repeats"]:
                print(f"    repeated frame: {line}", flush=True)
    finally:
        for conn in [*pipes, pub_parent]:
            with contextlib.suppress(OSError):
                conn.send(("exit",))
        for p in processes:
            p.join(30)
            if p.is_alive():
                p.kill()
    return results


def report(subscribers: int, results: list[dict], args) -> str:
    print(f"N={subscribers}, {len(results)} runs of {args.events} events:")
    print("  connected        " + _spread([r["connected"] for r in results]))
    print("  lost             " + _spread([r["lost"] for r in results]))
    print("  duplicated       " + _spread([r["duplicated"] for r in results]))
    low = min(r["per_subscriber"][0] for r in results)
    high = max(r["per_subscriber"][1] for r in results)
    print(f"  frames received per subscriber: expected {args.events}, got min {low} / max {high}")
    print("  p50 ms           " + _spread([r["p50"] for r in results]))
    print("  p95 ms           " + _spread([r["p95"] for r in results]))
    print("  max ms           " + _spread([r["max"] for r in results]))
    print("  connect s        " + _spread([r["connect_s"] for r in results], "{:.1f}"))
    slowest = _spread([r["slowest_call_ms"] for r in results], "{:.2f}")
    print(f"  slowest publish  {slowest} ms")
    print("  server us/frame  " + _spread([r["server_us_per_frame"] for r in results]))
    print("  subscribers' us/frame " + _spread([r["clients_us_per_frame"] for r in results]))
    print("  load average     " + _spread([r["load"] for r in results], "{:.1f}"))
    worst_connected = min(r["connected"] for r in results)
    total_lost = sum(r["lost"] for r in results)
    total_duplicated = sum(r["duplicated"] for r in results)
    p95 = statistics.median(r["p95"] for r in results)
    met = (
        worst_connected == subscribers
        and total_lost == 0
        and total_duplicated == 0
        and p95 < GOAL_P95_MS
    )
    return (
        f"ws_fanout {args.stream} N={subscribers}: connected {worst_connected}/{subscribers} "
        f"(worst run), frames per subscriber expected {args.events}, got {low}-{high}, "
        f"lost (not in {RECEIVE_GRACE_SECONDS:.0f} s after the last publish) "
        f"{total_lost} of {subscribers * args.events * len(results)}, "
        f"duplicated {total_duplicated}, "
        f"p95 median {p95:.0f} ms (range {min(r['p95'] for r in results):.0f}-"
        f"{max(r['p95'] for r in results):.0f}) vs goal < {GOAL_P95_MS:.0f} ms "
        f"({p95 / GOAL_P95_MS:.2f}x of the limit): {'met' if met else 'NOT met'}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--subscribers", type=int, nargs="+", default=[500, 2000])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--events", type=int, default=20)
    parser.add_argument("--interval", type=float, default=0.25)
    parser.add_argument("--workers", type=int, default=2, help="uvicorn worker processes")
    parser.add_argument("--clients", type=int, default=2, help="subscriber processes")
    parser.add_argument("--stream", choices=sorted(STREAMS), default="fleet")
    parser.add_argument(
        "--subscriber-client",
        choices=("lean", "aiohttp"),
        default="lean",
        help="the subscribers' websocket client (bench/_wsclient.py, or aiohttp's)",
    )
    parser.add_argument(
        "--profile",
        metavar="FILE",
        help="run one uvicorn worker under cProfile and write its stats to FILE (--workers 1)",
    )
    args = parser.parse_args()
    _raise_fd_limit()  # the server and the subscriber processes inherit it

    profile_to = Path(args.profile).resolve() if args.profile else None
    why = "the server under test uses it"
    with throwaway_database("bench_ws_fanout", why) as dbname:
        from django.db import connections

        cookie = "; ".join(f"{k}={v}" for k, v in session_cookie().items())
        connections.close_all()
        server_db = server_database_url(dbname, APPLICATION_NAME)
        server = start_uvicorn(server_db, args.workers, profile_to=profile_to)
        try:
            print(
                f"uvicorn --workers {args.workers}, DEBUG off, PostgreSQL, Redis pub/sub layer; "
                f"stream {STREAMS[args.stream][0]}; {args.clients} subscriber processes "
                f"({args.subscriber_client} client); "
                f"{args.events} events per run, one every {args.interval} s; fd limit "
                f"{resource.getrlimit(resource.RLIMIT_NOFILE)[0]}"
                + (f"; profiling to {profile_to}" if profile_to else ""),
                flush=True,
            )
            summaries = []
            for n in args.subscribers:
                # With workers > 1 uvicorn's supervisor does no per-frame work; it counts
                # anyway (it is idle), and a profiled single worker is the process itself.
                pids = process_tree(server.process.pid)
                summaries.append(report(n, bench(n, server.url, cookie, pids, args), args))
            for line in summaries:
                print(line)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
