"""Command line shared by `python -m controlplane.simfleet` and `manage.py simfleet`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from typing import Protocol

from controlplane.simfleet.config import FAMILIES, FAMILY_VLLM, FleetConfig
from controlplane.simfleet.latency import LatencyDistribution
from controlplane.simfleet.lineage import BROKEN_KINDS, LineageConfig
from controlplane.simfleet.runtime import SimFleetServer


class Output(Protocol):
    """Where `serve` prints: a text stream, or a management command's `self.stdout`."""

    def write(self, text: str, /) -> object: ...

    def flush(self) -> None: ...


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workers", type=int, default=12, help="number of workers (default 12)")
    parser.add_argument(
        "--namespaces", default="rl-a,rl-b", help="comma-separated worker namespaces"
    )
    parser.add_argument("--prefix", default=None, help="listener DYN_NAMESPACE_PREFIX")
    parser.add_argument("--family", choices=FAMILIES, default=FAMILY_VLLM)
    parser.add_argument("--model", default="sim-model")
    parser.add_argument("--listener-port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--frontend-port", type=int, default=0)
    parser.add_argument("--admin-port", type=int, default=0)
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default loopback only)")
    parser.add_argument(
        "--advertise-host", default=None, help="host name put in URLs, when binding 0.0.0.0"
    )
    parser.add_argument("--config", default=None, help="JSON fleet config (overrides the above)")
    parser.add_argument("--churn", type=float, default=None, metavar="SECONDS")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument(
        "--lineage-seed",
        type=int,
        default=None,
        help="serve a policy lineage with this seed (versions v1, v2, ... are its steps)",
    )
    parser.add_argument(
        "--broken",
        action="append",
        default=[],
        metavar="VERSION=KIND",
        help="a broken checkpoint of the lineage, e.g. v7=drift (repeatable; kinds: "
        + ", ".join(BROKEN_KINDS)
        + ")",
    )
    parser.add_argument("--ttft-ms", type=float, default=None, help="median time to first token")
    parser.add_argument("--token-ms", type=float, default=None, help="median time per token")


def build_config(args: argparse.Namespace) -> FleetConfig:
    if args.config:
        config = FleetConfig.from_file(args.config)
    else:
        namespaces = [ns.strip() for ns in args.namespaces.split(",") if ns.strip()]
        config = FleetConfig.generate(
            workers=args.workers,
            namespaces=namespaces or ["dynamo"],
            prefix=args.prefix,
            family=args.family,
            model=args.model,
        )
    config.host = args.host
    config.advertise_host = args.advertise_host
    # Explicit ports, churn and seed on the command line win over the config file.
    for name in ("listener_port", "frontend_port", "admin_port"):
        if getattr(args, name):
            setattr(config, name, getattr(args, name))
    if args.churn:
        config.churn_interval = args.churn
    if args.seed is not None:
        config.seed = args.seed
    if args.lineage_seed is not None:
        config.lineage = LineageConfig(seed=args.lineage_seed)
    if args.broken:
        if config.lineage is None:
            raise SystemExit("--broken needs a lineage (--lineage-seed, or one in --config)")
        for item in args.broken:
            version, _, kind = item.partition("=")
            try:
                config.lineage = LineageConfig.from_dict(
                    config.lineage.to_dict() | {"broken": config.lineage.broken | {version: kind}}
                )
            except ValueError as exc:
                raise SystemExit(f"--broken {item}: {exc}") from None
    if args.ttft_ms is not None:
        config.latency.ttft = LatencyDistribution(args.ttft_ms / 1000, config.latency.ttft.sigma)
    if args.token_ms is not None:
        config.latency.per_token = LatencyDistribution(
            args.token_ms / 1000, config.latency.per_token.sigma
        )
    return config


async def serve(config: FleetConfig, out: Output = sys.stdout) -> None:
    """Run until SIGINT/SIGTERM, printing the URLs once the ports are bound."""
    server = SimFleetServer(config)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    lines = [f"{name}={url}" for name, url in server.urls().items()]
    lines.append(f"workers={len(server.fleet.workers) if server.fleet else 0}")
    # One write per line: Django's OutputWrapper appends its own newline when one is missing.
    for line in lines:
        out.write(line + "\n")
    out.flush()
    try:
        await stop.wait()
    finally:
        await server.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m controlplane.simfleet", description="Run a simulated Dynamo RL fleet."
    )
    add_arguments(parser)
    asyncio.run(serve(build_config(parser.parse_args(argv))))
