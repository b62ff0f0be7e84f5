"""A live stack for the trainer library: the simulated fleet, a source over it, a webhook
endpoint, a viewer token, the web server in its own process and a real Celery worker (Redis
broker, PostgreSQL). The toy loop and the docs' framework skeletons run against it."""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.accounts.tokens import create_token
from controlplane.audit.recorder import Actor
from controlplane.fleet import discovery
from controlplane.fleet import services as fleet_services
from controlplane.fleet.models import DiscoveryTrigger
from controlplane.intake import services
from controlplane.intake.models import WebhookPolicy
from controlplane.simfleet import FleetConfig

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

    @property
    def frontend_url(self) -> str:
        return self.fleet.frontend_url  # type: ignore[attr-defined]

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
    system = Actor.system("test setup")
    source = fleet_services.create_source(
        actor=system,
        name="sim",
        listener_url=fleet.listener_url,
        frontend_url=fleet.frontend_url,
        expected_prefix="rl",
        allowed_networks=["127.0.0.0/8"],
    )
    endpoint, secret = services.create_webhook_endpoint(
        actor=system, name="toy-trainer", source=source, policy=WebhookPolicy.AUTO_START
    )
    _, token = create_token(user=user, label="toy-trainer", actor=system)
    # The first discovery (beat runs it on a live system): the scope and its gate exist.
    discovery.refresh_source(source.pk, trigger=DiscoveryTrigger.MANUAL, wait=15)
    return Stack(
        fleet=fleet,
        control_url=live_server_url,
        token=token,
        endpoint=endpoint.name,
        secret=secret,
    )
