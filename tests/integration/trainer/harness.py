"""A live stack for the trainer library: the simulated fleet, a source over it, a webhook
endpoint, a viewer token, the web server in its own process and a real Celery worker (Redis
broker, PostgreSQL). The toy loop and the docs' framework skeletons run against it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from controlplane.accounts.tokens import create_token
from controlplane.audit.recorder import Actor
from controlplane.fleet import discovery
from controlplane.fleet import services as fleet_services
from controlplane.fleet.models import DiscoveryTrigger
from controlplane.intake import services
from controlplane.intake.models import WebhookPolicy
from controlplane.simfleet import FleetConfig
from tests.fixtures.live_server import ROOT, _database_url, asgi_server

NAMESPACE = "rl-a"
MODEL = "policy"


@dataclass
class Stack:
    fleet: object
    control_url: str
    token: str
    endpoint: str
    secret: str
    source: str = "sim"
    namespace: str = NAMESPACE
    model: str = MODEL

    frontend: str = ""

    @property
    def frontend_url(self) -> str:
        return self.frontend

    def env(self) -> dict[str, str]:
        """The environment the example and the skeletons read."""
        return {
            "CONTROLPLANE_URL": self.control_url,
            "CONTROLPLANE_TOKEN": self.token,
            "TRAINER_ENDPOINT": self.endpoint,
            "TRAINER_SECRETS": self.secret,
            "CONTROLPLANE_SOURCE": self.source,
            "CONTROLPLANE_NAMESPACE": self.namespace,
            "DYNAMO_FRONTEND_URL": self.frontend_url,
            "POLICY_MODEL": self.model,
        }


def build_stack(simfleet_factory, user, live_server_url: str, *, workers: int = 3) -> Stack:
    fleet = simfleet_factory(
        FleetConfig.generate(
            workers=workers,
            namespaces=(NAMESPACE,),
            prefix="rl",
            seed=11,
            model=MODEL,
            listener_env={"DYN_RL_REQUEST_TIMEOUT_SECS": "2"},
        )
    )
    return wire_stack(fleet, fleet.listener_url, fleet.frontend_url, user, live_server_url)


def wire_stack(
    fleet, listener_url: str, frontend_url: str, user, live_server_url: str, *, model=MODEL
) -> Stack:
    """A source over the deployment, an auto-start webhook endpoint, a token, and the first
    discovery (beat runs it on a live system), so the scope and its gate exist."""
    system = Actor.system("test setup")
    source = fleet_services.create_source(
        actor=system,
        name="sim",
        listener_url=listener_url,
        frontend_url=frontend_url,
        expected_prefix="rl",
        allowed_networks=["127.0.0.0/8"],
    )
    endpoint, secret = services.create_webhook_endpoint(
        actor=system, name="toy-trainer", source=source, policy=WebhookPolicy.AUTO_START
    )
    _, token = create_token(user=user, label="toy-trainer", actor=system)
    discovery.run_discovery(source.pk, trigger=DiscoveryTrigger.MANUAL, wait=15)
    return Stack(
        fleet=fleet,
        control_url=live_server_url,
        token=token,
        endpoint=endpoint.name,
        secret=secret,
        model=model,
        frontend=frontend_url,
    )


@pytest.fixture(scope="module")
def trainer_stack_url(django_db_setup, tmp_path_factory) -> Iterator[str]:
    """The web server's URL; webhooks it accepts are processed by the worker beside it."""
    logs = tmp_path_factory.mktemp("trainer-stack")
    prefix = f"{os.environ.get('REDIS_KEY_PREFIX', '')}trainer-{uuid.uuid4().hex[:8]}:"
    env = dict(
        os.environ,
        DATABASE_URL=_database_url(),
        CONTROLPLANE_PROCESS="celery",
        REDIS_KEY_PREFIX=prefix,
    )
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    worker_log = logs / "celery.log"
    command = [
        sys.executable,
        *("-m", "celery", "-A", "controlplane", "worker", "-P", "threads", "-c", "4"),
        *("-l", "INFO", "--without-mingle", "--without-gossip"),
    ]
    with open(worker_log, "wb") as log:
        worker = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while b"ready." not in worker_log.read_bytes():
            if worker.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Celery worker did not start:\n{worker_log.read_text()}")
            time.sleep(0.2)
        with asgi_server(logs / "web.log", REDIS_KEY_PREFIX=prefix) as url:
            yield url
    finally:
        worker.terminate()
        try:
            worker.wait(20)
        except subprocess.TimeoutExpired:
            worker.kill()
