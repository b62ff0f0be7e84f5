"""The bare fan-out the refresh benches pair with: the same HTTP calls, no bookkeeping.

`planned_calls` reads a stored plan's calls; `bare_client` makes them with the executor's shape
(steps in order; per step every worker's calls in sequence, `concurrency` workers at a time);
`bare_discovery` makes a discovery's calls (the listener, then each worker's version and
liveness probes) with the probe concurrency bound. Plain aiohttp, nothing written anywhere.
"""

from __future__ import annotations

import asyncio


def planned_calls(refresh) -> tuple[str, list[list[list[tuple]]]]:
    """The refresh's calls as steps → workers → calls (method, url, body), read synchronously."""
    frontend = refresh.source.frontend_url.rstrip("/") + "/v1/completions"
    steps = []
    workers = list(refresh.workers.all())
    for step in ("pause", "update", "flush", "resume_engines", "verify"):
        per_worker = []
        for worker in workers:
            calls = []
            for call in worker.calls.get(step, []):
                if call["operation"] == "generation":
                    calls.append(("POST", frontend, call["body"]))
                else:
                    url = worker.system_url.rstrip("/") + "/" + call["path"]
                    calls.append((call["method"], url, call["body"]))
            if calls:
                per_worker.append(calls)
        steps.append(per_worker)
    return refresh.source.listener_url.rstrip("/") + "/v1/rl/workers", steps


async def bare_client(listener: str, steps, concurrency: int) -> int:
    """The same calls with the same shape (steps in order; per step every worker's calls in
    sequence, `concurrency` workers at a time) and no bookkeeping at all."""
    import aiohttp

    semaphore = asyncio.Semaphore(concurrency)
    count = 0
    connector = aiohttp.TCPConnector(limit=concurrency + 2)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def get_listener():
            async with session.get(listener) as response:
                await response.read()

        async def worker_calls(calls):
            nonlocal count
            async with semaphore:
                for method, url, body in calls:
                    async with session.request(method, url, json=body) as response:
                        await response.read()
                    count += 1

        await get_listener()
        for per_worker in steps:
            await asyncio.gather(*(worker_calls(calls) for calls in per_worker))
        await get_listener()
    return count + 2


async def bare_discovery(listener: str, concurrency: int) -> int:
    """A discovery's calls (the listener, then version + liveness per worker, `concurrency` at a
    time), parsing only the listing. Returns the number of calls made."""
    import aiohttp

    from controlplane.dynamo.families import VLLM_WORKER, Operation

    calls = [VLLM_WORKER.build(op)[0] for op in (Operation.GET_WEIGHT_VERSION, Operation.LIVENESS)]
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        async with session.get(listener) as response:
            payload = await response.json(content_type=None)
        permits = asyncio.Semaphore(concurrency)

        async def one(system_url: str, call) -> None:
            async with permits:
                url = system_url.rstrip("/") + "/" + call.path
                kwargs = {} if call.method == "GET" else {"json": call.body or {}}
                async with session.request(call.method, url, **kwargs) as reply:
                    await reply.read()

        jobs = [one(w["system_url"], c) for w in payload["workers"] for c in calls]
        await asyncio.gather(*jobs)
    return len(jobs) + 1
