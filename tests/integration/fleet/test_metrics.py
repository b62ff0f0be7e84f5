"""`/metrics` is valid Prometheus exposition: one block per family, values from the database."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from controlplane.audit.recorder import Actor
from controlplane.fleet import services
from controlplane.fleet.models import DiscoveryRun


@pytest.fixture
def sources(db):
    made = []
    for name in ("alpha", "beta"):
        made.append(
            services.create_source(
                actor=Actor.system("test"),
                name=name,
                listener_url="http://10.0.0.5:8001",
                allowed_networks=["10.0.0.0/8"],
            )
        )
    return made


def _samples(body: str) -> dict[tuple[str, tuple], float]:
    samples = {}
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def test_families_parse_and_carry_database_figures(client, sources):
    alpha, odd = sources
    now = timezone.now()
    beat = {"source": alpha, "trigger": "beat"}
    DiscoveryRun.objects.create(
        source=alpha,
        trigger="beat",
        started_at=now - timedelta(minutes=2),
        duration_ms=900,
        ok=True,
    )
    DiscoveryRun.objects.create(
        source=alpha,
        trigger="beat",
        started_at=now - timedelta(minutes=1),
        duration_ms=250,
        ok=False,
    )
    # The newest run is still in progress (no duration): the latest *finished* one is reported.
    DiscoveryRun.objects.create(**beat, started_at=now, ok=False)
    odd.stale = True
    odd.save(update_fields=["stale"])

    response = client.get("/metrics", REMOTE_ADDR="127.0.0.1")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    body = response.content.decode()

    # Each family's samples sit together under its own HELP/TYPE (the parser would split a
    # family interleaved with another into two).
    names = [f.name for f in text_string_to_metric_families(body)]
    assert len(names) == len(set(names))

    samples = _samples(body)
    assert samples[("controlplane_discovery_runs", (("source", "alpha"),))] == 3
    assert samples[("controlplane_discovery_listener_errors", (("source", "alpha"),))] == 2
    assert samples[("controlplane_discovery_last_duration_seconds", (("source", "alpha"),))] == 0.25
    assert samples[("controlplane_source_stale", (("source", odd.name),))] == 1
    assert samples[("controlplane_source_stale", (("source", "alpha"),))] == 0
