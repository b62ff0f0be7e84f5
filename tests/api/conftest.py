"""Objects every API test can point at: two sources, a worker, a run, a gate, a refresh, a
failed drill."""

import pytest
from django.utils import timezone

from controlplane.accounts.tokens import create_token
from controlplane.audit.recorder import Actor
from controlplane.fleet.models import DiscoveryRun, Source, Worker

U64 = "18446744073709551615"


@pytest.fixture
def fleet(db):
    now = timezone.now()
    a = Source.objects.create(
        name="src-a", listener_url="http://127.0.0.1:9/", allowed_networks=["127.0.0.0/8"]
    )
    b = Source.objects.create(
        name="src-b", listener_url="http://127.0.0.1:9/", allowed_networks=["127.0.0.0/8"]
    )
    worker = Worker.objects.create(
        source=a,
        namespace="rl-a",
        component="backend",
        endpoint="generate",
        instance_id=U64,
        first_seen_at=now,
        last_seen_at=now,
        routes=["pause_generation"],
    )
    run = DiscoveryRun.objects.create(source=a, trigger="manual", started_at=now, ok=True)
    from controlplane.refresh.models import Gate, GateState, PolicyRefresh

    gate = Gate.objects.create(source=a, namespace="rl-a", state=GateState.CLOSED, reason="held")
    refresh = PolicyRefresh.objects.create(
        source=a,
        namespaces=["rl-a"],
        target={"weight_version": "v2", "model_path": "/m"},
        state="held",
        held_reason="update failed",
    )
    from controlplane.refresh.models import DrillRun

    drill = DrillRun.objects.create(
        source=a,
        namespaces=["rl-a"],
        instances=[U64],
        current_policy={"weight_version": "v2"},
        previous_policy={"weight_version": "v1"},
        outcome="failed",
        reason="the forward refresh held",
    )
    return {
        "a": a,
        "b": b,
        "worker": worker,
        "run": run,
        "gate": gate,
        "refresh": refresh,
        "drill": drill,
    }


def bearer(secret: str) -> dict:
    return {"HTTP_AUTHORIZATION": f"Bearer {secret}"}


@pytest.fixture
def token_factory(db):
    def make(user, label="t", sources=()):
        _, secret = create_token(user=user, label=label, actor=Actor.system(), sources=sources)
        return secret

    return make
