"""End-to-end bench: a trainer's signed webhook to the gate API answering the new version.

    DATABASE_URL=postgres://... REDIS_URL=redis://127.0.0.1:6379/<db> \\
        .venv/bin/python bench/end_to_end.py [--workers 500] [--repetitions 5] [--latency-ms 20]

Prints figures, asserts nothing. Everything runs as the product runs it, in processes of its
own: `uvicorn controlplane.asgi:application --workers N`, a Celery worker (`--pool threads`, as
deploy/ starts it) and Celery beat, PostgreSQL (a throwaway database, dropped at the end),
Redis (a key prefix of the bench's own, broker queues included, deleted at the end) and the
simulated fleet (N vLLM workers in three namespaces whose admin routes and generations answer
after `--latency-ms`). DEBUG is off.

One run of ours: the trainer library (`clients/python`, `ControlPlane.announce_checkpoint`)
signs and sends `checkpoint.ready` for a new weight version (disk method, a model path) to an
auto-start webhook endpoint; the clock starts just before the send and stops when the gate API
(`GET /api/v1/gates/<source>/<namespace>`, a viewer's bearer token, the library's `gate()` with
its ETag) answers every namespace verified open at the new version, polled every `--poll-ms`.
In between: the intake task plans (a fresh discovery of the fleet), the executor task runs the
refresh (gate, resolve, pause, update, flush, resume, verify, reopen).

The bare run, in this process, in alternating order with ours (`_paired.py`'s style): the same
HTTP calls to the fleet with the same concurrency bounds and nothing else — the plan's
discovery (listener, version and liveness per worker, `DISCOVERY_PROBE_CONCURRENCY` at a time)
then the refresh's calls (`_fanout.bare_client`, `REFRESH_CONCURRENCY` workers at a time). Its
calls are the last refresh's own, so it loads the version the fleet already serves and leaves
nothing for ours to notice.

The breakdown of each run of ours comes from what the system records (the delivery's
`received_at`, the plan's discovery run, the refresh's `created_at`/`started_at`/`finished_at`,
each step run's start and end) and the bench's clock (send, answer, gate seen), all on this
machine's clock. Each stage ends at its event and starts at the previous one, so the stages add
up to the total.

The source's periodic discovery is set to `--discovery-interval` (default an hour) so a
scheduled discovery does not land in a run: a plan waits for a discovery that starts after it
was asked, so one in progress when a webhook arrives would cost a second discovery.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent / "clients" / "python" / "src"))

# _servers configures this process on import: DEBUG off, a var dir and Redis prefix of its own.
from _fanout import bare_client, bare_discovery, planned_calls  # noqa: E402
from _fleet import serve_fleet  # noqa: E402
from _servers import (  # noqa: E402
    cpu_seconds,
    delete_bench_keys,
    process_tree,
    start_celery,
    start_uvicorn,
    stop,
    throwaway_database,
)

NAMESPACES = ["rl-a", "rl-b", "rl-c"]
SOURCE = "bench-e2e"
ENDPOINT = "bench-trainer"
MODEL_PATH = "/ckpt/policy"
#: The goal the figures are read against: ours within 1.2 x the bare fan-out plus 1 s.
GOAL_FACTOR, GOAL_SLACK = 1.2, 1.0


@dataclass
class Trainer:
    """What the trainer holds: the library's `ControlPlane` (webhook secret and gate token)."""

    client: Any
    namespaces: list[str]


@dataclass
class Run:
    wall: float
    #: CPU seconds: of the server processes (web, Celery worker, beat) for ours, of this
    #: process for the bare fan-out.
    cpu: float
    stages: list[tuple[str, float]] = field(default_factory=list)
    calls: int = 0


# -- setup -------------------------------------------------------------------------------------


def prepare(fleet_urls: dict, discovery_interval: float) -> dict:
    """The source (discovered once), an auto-start webhook endpoint and a viewer's token."""
    from controlplane.accounts import tokens
    from controlplane.accounts.roles import Role
    from controlplane.accounts.services import create_user_with_role
    from controlplane.audit.recorder import Actor
    from controlplane.fleet import services
    from controlplane.fleet.discovery import run_discovery
    from controlplane.fleet.models import DiscoveryTrigger
    from controlplane.intake.models import WebhookPolicy
    from controlplane.intake.services.endpoints import create_webhook_endpoint

    actor = Actor.system("bench")
    source = services.create_source(
        actor=actor,
        name=SOURCE,
        listener_url=fleet_urls["listener_url"],
        frontend_url=fleet_urls["frontend_url"],
        allowed_networks=["127.0.0.0/8"],
        expected_prefix="rl",
        discovery_interval_seconds=discovery_interval,
    )
    run = run_discovery(source.pk, trigger=DiscoveryTrigger.MANUAL)
    assert run is not None and run.ok, "the first discovery of the fleet failed"
    endpoint, secret = create_webhook_endpoint(
        actor=actor, name=ENDPOINT, source=source, policy=WebhookPolicy.AUTO_START
    )
    user = create_user_with_role("bench-trainer", Role.VIEWER, uuid.uuid4().hex, validate=False)
    _, token = tokens.create_token(user=user, label="bench", actor=actor, sources=[source])
    return {"source": source, "endpoint": endpoint.name, "secret": secret, "token": token}


def start_product(web_processes: int, celery_threads: int, log_dir: Path) -> tuple[list, str]:
    """Web, Celery worker and beat on the throwaway database: (processes, the web's URL)."""
    from django.db import connections

    connections.close_all()
    url = os.environ["DATABASE_URL"]
    started = []
    try:
        worker = ["worker", "--pool", "threads", "-c", str(celery_threads), "-l", "INFO"]
        started.append(start_celery(url, worker, log_path=log_dir / "celery-worker.log"))
        beat = ["beat", "-l", "INFO", "-s", str(log_dir / "celerybeat-schedule")]
        started.append(start_celery(url, beat, log_path=log_dir / "celery-beat.log"))
        web = start_uvicorn(url, web_processes)
    except BaseException:
        stop(started)
        raise
    return [*started, web.process], web.url


# -- one run of ours ---------------------------------------------------------------------------


class RunFailed(SystemExit):
    pass


def wait_for_gates(trainer, version: str, webhook_id: str, timeout: float, poll: float) -> float:
    """Poll each namespace's gate (the library's `gate()`: ETag, 304 while unchanged) until
    every one admits `version`; return the time.time() of the answer that made it so. Checks the
    delivery and refresh in the database about once a second, to stop at once on a refusal or
    a held refresh instead of waiting out the timeout."""
    from dynamo_rl_trainer.errors import NotFound

    waiting = set(trainer.namespaces)
    deadline = time.monotonic() + timeout
    next_check = time.monotonic() + 1.0
    while True:
        for namespace in sorted(waiting):
            with contextlib.suppress(NotFound):
                if trainer.client.gate(namespace).admits(version):
                    waiting.discard(namespace)
        if not waiting:
            return time.time()
        now = time.monotonic()
        if now >= next_check:
            next_check = now + 1.0
            problem = refused(webhook_id)
            if problem:
                raise RunFailed(f"version {version}: {problem}")
        if now >= deadline:
            raise RunFailed(f"version {version}: gates {sorted(waiting)} not open after {timeout}s")
        time.sleep(poll)


def refused(webhook_id: str) -> str:
    """Why the delivery or its refresh can no longer open the gate ('' while it still can)."""
    from controlplane.intake.models import DeliveryState, ReceivedWebhook
    from controlplane.intake.models import ReceivedWebhookOutcome as Outcome
    from controlplane.refresh.models import PolicyRefresh, RefreshState

    delivery = ReceivedWebhook.objects.filter(webhook_id=webhook_id).first()
    if delivery is None:
        return "the delivery was not stored"
    # `retrying` (the scope was busy, the database hiccuped) may still start it: keep waiting.
    if delivery.state == DeliveryState.RETRYABLE or (
        delivery.state == DeliveryState.DONE and delivery.outcome != Outcome.STARTED
    ):
        why = delivery.detail or delivery.last_error
        return f"delivery {delivery.state}/{delivery.outcome}: {why}"
    if delivery.refresh_id is not None:
        refresh = PolicyRefresh.objects.get(pk=delivery.refresh_id)
        ended_badly = refresh.state in (
            RefreshState.HELD,
            RefreshState.FAILED,
            RefreshState.ABORTED,
            RefreshState.REJECTED,
        )
        if ended_badly:
            reason = refresh.held_reason or refresh.end_reason
            return f"refresh #{refresh.pk} {refresh.state}: {reason}"
    return ""


def ours(trainer, version: str, servers: list, timeout: float, poll: float) -> Run:
    pids = [pid for p in servers for pid in process_tree(p.pid)]
    cpu0 = cpu_seconds(pids)
    sent = time.time()
    answer = trainer.client.announce_checkpoint(version, model_path=MODEL_PATH)
    answered = time.time()
    if answer.http_status != 202:
        raise RunFailed(f"version {version}: webhook answered {answer}")
    seen = wait_for_gates(trainer, version, answer.webhook_id, timeout, poll)
    cpu = cpu_seconds(pids) - cpu0
    # The gate opens inside the reopen step; the refresh ends just after. The next run waits
    # for that end (a scope with an active refresh answers a new checkpoint with a retry).
    wait_until_finished(answer.webhook_id, timeout)
    run = Run(wall=seen - sent, cpu=cpu)
    run.stages = breakdown(answer.webhook_id, sent, answered, seen)
    return run


def wait_until_finished(webhook_id: str, timeout: float) -> None:
    from controlplane.intake.models import ReceivedWebhook
    from controlplane.refresh.models import PolicyRefresh

    refresh_id = ReceivedWebhook.objects.get(webhook_id=webhook_id).refresh_id
    deadline = time.monotonic() + timeout
    while not PolicyRefresh.objects.filter(pk=refresh_id, finished_at__isnull=False).exists():
        if time.monotonic() > deadline:
            raise RunFailed(f"refresh #{refresh_id} did not end within {timeout}s")
        time.sleep(0.05)


def breakdown(webhook_id: str, sent: float, answered: float, seen: float):
    """(stage, seconds) in order; each stage ends at its event and starts at the previous one."""
    from controlplane.intake.models import ReceivedWebhook
    from controlplane.refresh.models import PolicyRefresh

    delivery = ReceivedWebhook.objects.get(webhook_id=webhook_id)
    refresh = PolicyRefresh.objects.select_related("discovery_run").get(pk=delivery.refresh_id)
    plan_run = refresh.discovery_run
    events: list[tuple[str, float]] = [("webhook stored (received_at)", ts(delivery.received_at))]
    events.append(("webhook answered (HTTP 202 at the trainer)", answered))
    if plan_run is not None:
        events.append(("intake task picked up (plan's discovery starts)", ts(plan_run.started_at)))
        events.append(("plan's discovery", ts(plan_run.finished_at)))
    events.append(("plan stored (refresh created)", ts(refresh.created_at)))
    events.append(("refresh started (executor task sent)", ts(refresh.started_at)))
    for i, step in enumerate(refresh.steps.order_by("started_at", "pk")):
        if i == 0:
            events.append(("executor task picked up (first step starts)", ts(step.started_at)))
        events.append((f"step {step.name} ({step.status})", ts(step.finished_at)))
    # From the reopen step's recorded end: negative when the poller saw the gate open before the
    # step had written its end (the gate opens in the step's transaction).
    events.append(("gate visible to the poller", seen))
    stages, previous = [], sent
    for label, at in events:
        stages.append((label, at - previous))
        previous = at
    # Not part of the total: the refresh's own end, after the gate opened in its reopen step.
    stages.append(("(after) refresh finished, from the gate seen", ts(refresh.finished_at) - seen))
    return stages


def ts(moment) -> float:
    return moment.timestamp() if moment is not None else float("nan")


def trainer_client(web_url: str, data: dict):
    """The trainer's client of the bench's source (`prepare`'s endpoint, secret and token), on
    a connection of its own; a context manager."""
    from dynamo_rl_trainer import ControlPlane

    return ControlPlane(
        web_url,
        source=SOURCE,
        namespace=NAMESPACES[0],
        endpoint=data["endpoint"],
        secrets=data["secret"],
        token=data["token"],
    )


def warm_web_processes(web_url: str, data: dict, connections: int) -> None:
    """A signed `test.ping` and a gate read on each of `connections` new connections, so every
    web process has served both paths once (the kernel hands each new connection to one of
    them; a trainer's client keeps its connection only while it is busy)."""
    for _ in range(connections):
        with trainer_client(web_url, data) as fresh:
            fresh.send_event("test.ping", {"message": "bench warm-up"})
            fresh.gate()


# -- one bare run ------------------------------------------------------------------------------


def latest_refresh():
    from controlplane.refresh.models import PolicyRefresh, RefreshState

    return (
        PolicyRefresh.objects.select_related("source")
        .filter(source__name=SOURCE, state=RefreshState.SUCCEEDED)
        .latest("finished_at")
    )


def bare(listener: str, steps, discovery_concurrency: int, concurrency: int) -> Run:
    marks: list[float] = []

    async def fan_out() -> int:
        found = await bare_discovery(listener, discovery_concurrency)
        marks.append(time.perf_counter())
        return found + await bare_client(listener, steps, concurrency)

    cpu0, t0 = time.process_time(), time.perf_counter()
    calls = asyncio.run(fan_out())
    end = time.perf_counter()
    run = Run(wall=end - t0, cpu=time.process_time() - cpu0, calls=calls)
    run.stages = [("discovery's calls", marks[0] - t0), ("refresh's calls", end - marks[0])]
    return run


# -- report ------------------------------------------------------------------------------------


def spread(values: list[float], unit: float = 1000.0) -> str:
    scaled = [v * unit for v in values]
    return f"{statistics.median(scaled):8.0f} {min(scaled):8.0f} {max(scaled):8.0f}"


def report(workers: int, latency_ms: float, ours_runs: list[Run], bare_runs: list[Run]) -> None:
    print(f"\n{'':52} {'median':>8} {'min':>8} {'max':>8}  (ms)")
    print(
        f"{'ours: webhook sent -> gate API answers it, wall':52} "
        f"{spread([r.wall for r in ours_runs])}"
    )
    print(f"{'bare fan-out, wall':52} {spread([r.wall for r in bare_runs])}")
    print(f"{'ours: CPU of web + Celery worker + beat':52} {spread([r.cpu for r in ours_runs])}")
    print(f"{'bare: CPU of this process':52} {spread([r.cpu for r in bare_runs])}")
    print("\nbreakdown of ours (each stage from the previous event to its own):")
    labels = [label for label, _ in ours_runs[0].stages]
    for k, label in enumerate(labels):
        values = [r.stages[k][1] for r in ours_runs if len(r.stages) == len(labels)]
        print(f"  {label:50} {spread(values)}")
    print("  (each run's steps, in order, must match the first run's to be listed)")
    print("bare fan-out, in parts:")
    for k, (label, _) in enumerate(bare_runs[0].stages):
        print(f"  {label:50} {spread([r.stages[k][1] for r in bare_runs])}")
    allowed = [GOAL_FACTOR * b.wall + GOAL_SLACK for b in bare_runs]
    ratios = [o.wall / a for o, a in zip(ours_runs, allowed, strict=True)]
    wall_ratio = statistics.median(
        o.wall / b.wall for o, b in zip(ours_runs, bare_runs, strict=True)
    )
    ratio = statistics.median(ratios)
    print(
        f"\nSUMMARY end to end, {workers} workers, {latency_ms:g} ms routes, {len(ours_runs)} "
        f"pairs: ours {statistics.median(r.wall for r in ours_runs):.2f} s, bare "
        f"{statistics.median(r.wall for r in bare_runs):.2f} s (wall ratio {wall_ratio:.2f}); "
        f"goal ours <= {GOAL_FACTOR:g} x bare + {GOAL_SLACK:g} s: median of ours / allowed "
        f"{ratio:.2f} ({'met' if ratio <= 1 else 'not met'})"
    )


# -- main --------------------------------------------------------------------------------------


def _stop_on_sigterm(signum, frame):
    raise KeyboardInterrupt  # unwinds through every cleanup, as Ctrl-C does


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--workers", type=int, default=500)
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--web-processes", type=int, default=2)
    parser.add_argument("--celery-threads", type=int, default=16, help="as docker-compose.yml")
    parser.add_argument("--poll-ms", type=float, default=50.0, help="the gate poller's interval")
    parser.add_argument("--timeout", type=float, default=600.0, help="per run of ours, seconds")
    parser.add_argument("--discovery-interval", type=float, default=3600.0)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    log_dir = Path(tempfile.mkdtemp(prefix="bench-e2e-logs-"))

    with (
        throwaway_database("bench_e2e", "the product under test uses it"),
        contextlib.ExitStack() as cleanup,
    ):
        from django.conf import settings

        from controlplane.simfleet import FleetConfig

        cleanup.callback(delete_bench_keys)
        config = FleetConfig.generate(
            workers=args.workers,
            namespaces=NAMESPACES,
            prefix="rl",
            seed=7,
            listener_env={"DYN_RL_MAX_CONCURRENT_PROBES": "4096"},
        )
        latency = args.latency_ms / 1000.0
        urls = cleanup.enter_context(serve_fleet(config, latency, ["*", "generate"]))
        data = prepare(urls, args.discovery_interval)
        servers, web_url = start_product(args.web_processes, args.celery_threads, log_dir)
        cleanup.callback(stop, servers)
        client = cleanup.enter_context(trainer_client(web_url, data))
        trainer = Trainer(client, NAMESPACES)
        print(
            f"end-to-end bench: {args.workers} workers in {len(NAMESPACES)} namespaces, routes "
            f"answer in {args.latency_ms:g} ms, refresh concurrency {settings.REFRESH_CONCURRENCY}"
            f", discovery probe concurrency {settings.DISCOVERY_PROBE_CONCURRENCY}, uvicorn x"
            f"{args.web_processes}, Celery worker (threads x{args.celery_threads}) and beat, "
            f"PostgreSQL, Redis, DEBUG {settings.DEBUG}, gate polled every {args.poll_ms:g} ms, "
            f"{args.repetitions} alternating pairs; logs in {log_dir}",
            flush=True,
        )
        poll = args.poll_ms / 1000.0
        t0 = time.perf_counter()
        # Warm-up (not reported): the processes' first task, imports, connections and caches,
        # as a long-running deployment has them; it also gives the bare run its calls.
        warm = ours(trainer, "warmup", servers, args.timeout, poll)
        warm_web_processes(web_url, data, 4 * args.web_processes)
        print(f"  warm-up: {warm.wall * 1000:.0f} ms", flush=True)
        ours_runs: list[Run] = []
        bare_runs: list[Run] = []
        for i in range(args.repetitions):
            listener, steps = planned_calls(latest_refresh())
            order = ("ours", "bare") if i % 2 == 0 else ("bare", "ours")
            for which in order:
                if which == "ours":
                    ours_runs.append(ours(trainer, f"v{i + 1}", servers, args.timeout, poll))
                else:
                    bare_runs.append(
                        bare(
                            listener,
                            steps,
                            settings.DISCOVERY_PROBE_CONCURRENCY,
                            settings.REFRESH_CONCURRENCY,
                        )
                    )
            o, b = ours_runs[-1], bare_runs[-1]
            print(
                f"  pair {i + 1}/{args.repetitions} ({' then '.join(order)}): ours "
                f"{o.wall * 1000:7.0f} ms wall, servers' CPU {o.cpu * 1000:7.0f} ms | bare "
                f"{b.wall * 1000:7.0f} ms wall, CPU {b.cpu * 1000:7.0f} ms ({b.calls} calls)",
                flush=True,
            )
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        print(f"bench took {time.perf_counter() - t0:.0f} s; load average at the end {load}")
    report(args.workers, args.latency_ms, ours_runs, bare_runs)


if __name__ == "__main__":
    main()
