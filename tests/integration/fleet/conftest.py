"""Helpers for fleet tests: a source pointed at a simulated fleet, and waiting on conditions."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import pytest

from controlplane.audit.recorder import Actor
from controlplane.fleet import services

LOOPBACK = ["127.0.0.0/8"]


def wait_for[T](predicate: Callable[[], T], *, timeout: float = 20.0, interval: float = 0.05) -> T:
    """Poll `predicate` until it returns something truthy; fail with a clear message at the
    deadline instead of sleeping a guessed amount."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


def closed_port_url() -> str:
    """A loopback URL nothing listens on (the port was just free)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def make_source(db):
    def make(fleet, *, name="sim", **kwargs):
        values = {
            "listener_url": fleet.listener_url,
            "frontend_url": fleet.frontend_url,
            "allowed_networks": LOOPBACK,
            "expected_prefix": "rl",
            **kwargs,
        }
        return services.create_source(actor=Actor.system("test"), name=name, **values)

    return make
