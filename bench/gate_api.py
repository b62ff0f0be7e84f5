"""The gate API under polling load, against a minimal aiohttp server: prints figures only.

    DATABASE_URL=postgres://... .venv/bin/python bench/gate_api.py \\
        [--runs 5] [--requests 3000] [--concurrency 64,256] [--web-processes 2] [--conditional]

Prepares once: a throwaway PostgreSQL database (migrated), one source with a namespace of 64
workers, its gate opened through the gate writer (so its copy is in Redis), a viewer token
limited to that source. Then serves it two ways, each as real processes on this machine:

- ours: `uvicorn controlplane.asgi:application --workers N` (DEBUG off, PostgreSQL, Redis),
  exactly as production runs it;
- bare: N aiohttp processes accepting on one shared socket (as uvicorn's workers do), whose
  handler does the least the same answer needs: parse the bearer token, fetch its grant and
  the gate's JSON in one MGET, check the secret's SHA-256, the permission and the source,
  compare the ETag, send the JSON with the same headers (the security headers too, so the
  one load generator parses the same responses from both).

One aiohttp client (this process) drives both with the same requests, at each concurrency, in
alternating order, `--runs` times after a warm-up. `--conditional` sends the last ETag in
`If-None-Match`, as a poller does (mostly 304s); the default asks for the full body. Prints
per run req/s, the servers' CPU per request (their processes' user + system time) and errors
(transport failures and any status but 200/304), then min / median / max per server and
concurrency, and one summary line with the ratios of the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

# _servers configures the bench process on import: DEBUG off, a Redis prefix of its own.
from _servers import (
    ROOT,
    cpu_seconds,
    process_tree,
    start_uvicorn,
    stop,
    throwaway_database,
    wait_until_up,
)

SOURCE = "bench-src"
NAMESPACE = "rl-bench"
WORKERS = 64
VIEW_PERM = "accounts.view_controlplane"


# -- the bare server ---------------------------------------------------------------------------


def serve_bare(fd: int, redis_url: str, grant_key: str, gate_key: str, extra: str) -> None:
    """A minimal aiohttp gate endpoint reading the same Redis keys (one process of N, all
    accepting on one inherited listening socket: how `uvicorn --workers N` shares its port)."""
    import redis.asyncio
    from aiohttp import web

    with contextlib.suppress(ImportError):
        import uvloop  # the same event loop uvicorn runs ours on

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())

    # As ours (controlplane/redis_client.py): requests wait for one of 48 connections instead
    # of failing past redis-py's default 100 ("Too many connections").
    pool = redis.asyncio.BlockingConnectionPool.from_url(redis_url, max_connections=48, timeout=2)
    client = redis.asyncio.Redis(connection_pool=pool)

    async def gate(request: web.Request) -> web.Response:
        scheme, _, secret = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secret:
            return web.Response(status=401)
        raw_grant, raw_gate = await client.mget(grant_key, gate_key)
        if raw_grant is None or raw_gate is None:
            return web.Response(status=500, text="bench data missing from Redis")
        grant = json.loads(raw_grant)
        if grant["secret_hash"] != hashlib.sha256(secret.encode()).hexdigest():
            return web.Response(status=401)
        revision, source_id, _, mark, body = raw_gate.split(b" ", 4)
        if VIEW_PERM not in grant["perms"] or int(source_id) not in grant["source_ids"]:
            return web.Response(status=404)
        etag = f'"{int(source_id)}.{revision.decode()}.{mark.decode()}"'
        headers = {"ETag": etag, "Cache-Control": "private, no-cache", **same_headers}
        headers["X-Request-ID"] = os.urandom(16).hex()
        if request.headers.get("If-None-Match") == etag:
            return web.Response(status=304, headers=headers)
        return web.Response(body=body, content_type="application/json", headers=headers)

    # The security headers ours sends (CSP, X-Frame-Options, ...): the same answer on the wire,
    # so the one load generator parses the same responses from both.
    same_headers = json.loads(extra)
    app = web.Application()
    app.router.add_get("/api/v1/gates/{source}/{namespace}", gate)
    listening = socket.socket(fileno=fd)
    web.run_app(app, sock=listening, print=None, access_log=None)


# -- setup -------------------------------------------------------------------------------------


def prepare() -> dict:
    """The fleet, its open gate (copied to Redis on commit) and a limited viewer token."""
    from django.utils import timezone

    from controlplane import redis_client
    from controlplane.accounts import tokens
    from controlplane.accounts.roles import Role
    from controlplane.accounts.services import create_user_with_role
    from controlplane.audit.recorder import Actor
    from controlplane.fleet.models import Source, Worker
    from controlplane.refresh import gate_cache
    from controlplane.refresh.gates import force_open, gate_for

    source = Source.objects.create(
        name=SOURCE, listener_url="http://127.0.0.1:9/", allowed_networks=["127.0.0.0/8"]
    )
    now = timezone.now()
    Worker.objects.bulk_create(
        Worker(
            source=source,
            namespace=NAMESPACE,
            component="backend",
            endpoint="generate",
            instance_id=str(10**12 + i),
            first_seen_at=now,
            last_seen_at=now,
        )
        for i in range(WORKERS)
    )
    actor = Actor.system("bench")
    force_open([gate_for(source, NAMESPACE)], actor=actor, refresh=None, reason="bench")
    user = create_user_with_role("bench-trainer", Role.VIEWER, uuid.uuid4().hex, validate=False)
    _, secret = tokens.create_token(user=user, label="bench", actor=actor, sources=[source])
    # The bare server reads the same grant and gate bytes, from keys of its own that do not
    # expire: ours lets its copies lapse (grant after 5 s, gate after 10 s) and rebuilds them
    # from the database, and pays for that in these figures.
    client = redis_client.sync_client()
    grant = tokens.grant_for(secret)
    cached = gate_cache.read(SOURCE, NAMESPACE)
    assert grant is not None and cached is not None, "the gate writer did not fill Redis"
    bare_keys = {"grant_key": redis_client.key("bench-bare", "grant")}
    bare_keys["gate_key"] = redis_client.key("bench-bare", "gate")
    client.set(bare_keys["grant_key"], grant.encode())
    client.set(bare_keys["gate_key"], gate_cache.encode(cached.payload(), cached.source_id))
    return {"secret": secret, **bare_keys}


# -- servers -----------------------------------------------------------------------------------


def start_bare(processes: int, data: dict) -> tuple[list[subprocess.Popen], int]:
    from django.conf import settings

    listening = socket.socket()
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listening.bind(("127.0.0.1", 0))
    listening.listen(2048)  # uvicorn's default backlog
    port = listening.getsockname()[1]
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from bench.gate_api import serve_bare; "
        "serve_bare(int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6])"
    )
    argv = [
        sys.executable,
        "-c",
        code,
        str(ROOT),
        str(listening.fileno()),
        settings.REDIS_URL,
        data["grant_key"],
        data["gate_key"],
        json.dumps(_security_headers()),
    ]
    started = [
        subprocess.Popen(argv, cwd=ROOT, start_new_session=True, pass_fds=[listening.fileno()])
        for _ in range(processes)
    ]
    listening.close()  # the children hold it
    return started, port


def _security_headers() -> dict[str, str]:
    from controlplane.intake.api.fast_gate import _security_headers as ours

    return {name.decode(): value.decode("latin-1") for name, value in ours(False)}


# -- load --------------------------------------------------------------------------------------


async def burst(url: str, secret: str, requests: int, concurrency: int, conditional: bool):
    import aiohttp

    statuses: Counter = Counter()
    remaining = requests
    headers = {"Authorization": f"Bearer {secret}"}
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def client() -> None:
            nonlocal remaining
            etag = None
            while remaining > 0:
                remaining -= 1
                sent = dict(headers, **({"If-None-Match": etag} if conditional and etag else {}))
                try:
                    async with session.get(url, headers=sent) as response:
                        await response.read()
                        statuses[response.status] += 1
                        etag = response.headers.get("ETag", etag)
                except (TimeoutError, aiohttp.ClientError) as exc:
                    statuses[type(exc).__name__] += 1

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    errors = sum(n for s, n in statuses.items() if s not in (200, 304))
    return requests / elapsed, errors, dict(statuses)


def _delete_bench_keys() -> None:
    """Everything this run wrote to Redis is under its own REDIS_KEY_PREFIX."""
    import redis

    prefix = os.environ["REDIS_KEY_PREFIX"]
    client = redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    with contextlib.suppress(redis.RedisError):
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            client.unlink(*keys)


def server_cpu(processes: list[subprocess.Popen]) -> float:
    """CPU seconds used so far by the server processes and their children (uvicorn workers)."""
    return cpu_seconds([pid for p in processes for pid in process_tree(p.pid)])


def _span(values: list[float]) -> str:
    return (
        f"median {statistics.median(values):.0f} "
        f"(min {min(values):.0f}, max {max(values):.0f}) req/s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--concurrency", default="64,256")
    parser.add_argument("--web-processes", type=int, default=2)
    parser.add_argument("--conditional", action="store_true")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]

    running: list[subprocess.Popen] = []
    why = "the server under test uses it"
    with throwaway_database("bench_gate_api", why), contextlib.ExitStack() as cleanup:
        cleanup.callback(_delete_bench_keys)
        cleanup.callback(stop, running)
        data = prepare()
        from django.db import connections

        connections.close_all()
        path = f"/api/v1/gates/{SOURCE}/{NAMESPACE}"
        auth = {"Authorization": f"Bearer {data['secret']}"}
        ours = start_uvicorn(
            os.environ["DATABASE_URL"], args.web_processes, ready_path=path, ready_headers=auth
        )
        running.append(ours.process)
        bare, bare_port = start_bare(args.web_processes, data)
        running += bare
        urls = {"ours": ours.url + path}
        urls["bare"] = f"http://127.0.0.1:{bare_port}{path}"
        wait_until_up(urls["bare"], None, auth)
        kind = "conditional (If-None-Match)" if args.conditional else "full-body"
        print(
            f"{args.runs} runs of {args.requests} {kind} GET {path} per server and concurrency; "
            f"{args.web_processes} server processes each; DEBUG off; PostgreSQL + Redis"
        )
        results: dict[tuple[str, int], list[float]] = {}
        cpu: dict[tuple[str, int], list[float]] = {}
        servers = {"ours": [ours.process], "bare": bare}
        errors: dict[tuple[str, int], int] = {}
        for concurrency in levels:
            for url in urls.values():  # warm-up: connections, caches, imports
                asyncio.run(burst(url, data["secret"], 500, concurrency, args.conditional))
            for n in range(1, args.runs + 1):
                order = ["ours", "bare"] if n % 2 else ["bare", "ours"]
                for name in order:
                    cpu_before = server_cpu(servers[name])
                    rps, failed, statuses = asyncio.run(
                        burst(
                            urls[name], data["secret"], args.requests, concurrency, args.conditional
                        )
                    )
                    cpu_ms = (server_cpu(servers[name]) - cpu_before) * 1000 / args.requests
                    cpu.setdefault((name, concurrency), []).append(cpu_ms)
                    results.setdefault((name, concurrency), []).append(rps)
                    errors[(name, concurrency)] = errors.get((name, concurrency), 0) + failed
                    print(
                        f"  c={concurrency} run {n} {name}: {rps:.0f} req/s, "
                        f"server CPU {cpu_ms:.2f} ms/request, {failed} errors, "
                        f"statuses {statuses}"
                    )
        print()
        for concurrency in levels:
            for name in ("ours", "bare"):
                key = (name, concurrency)
                ms = cpu[key]
                print(
                    f"c={concurrency} {name}: {_span(results[key])}, server CPU median "
                    f"{statistics.median(ms):.2f} ms/request (min {min(ms):.2f}, max "
                    f"{max(ms):.2f}), {errors[key]} errors"
                )
        summary = []
        for concurrency in levels:
            ours_m = statistics.median(results[("ours", concurrency)])
            bare_m = statistics.median(results[("bare", concurrency)])
            # CPU per request is the steadier figure on a shared machine: bare's over ours.
            cpu_ratio = statistics.median(cpu[("bare", concurrency)]) / statistics.median(
                cpu[("ours", concurrency)]
            )
            summary.append(
                f"c={concurrency} ours/bare {ours_m / bare_m:.2f} "
                f"({ours_m:.0f}/{bare_m:.0f} req/s, errors {errors[('ours', concurrency)]}; "
                f"CPU per request bare/ours {cpu_ratio:.2f})"
            )
        print("SUMMARY gate API: " + "; ".join(summary) + " (goal: ratio >= 0.9, 0 errors)")


if __name__ == "__main__":
    main()
