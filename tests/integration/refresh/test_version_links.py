"""Every place a page names a weight version links it to its provenance: the worker page, the
held/refresh banner and the gate badges (the gate table and refresh lists already do)."""

from __future__ import annotations

import pytest
from django.utils import timezone

from controlplane.fleet.models import Source, Worker
from controlplane.refresh.models import Gate, GateState, PolicyRefresh, RefreshState

pytestmark = pytest.mark.django_db

LINK = (
    '<a class="version-link" href="/versions/{v}/provenance/" '
    'title="Provenance of this version"><code>{v}</code></a>'
)


@pytest.fixture
def source(db):
    return Source.objects.create(
        name="src-a", listener_url="http://127.0.0.1:9/", allowed_networks=["127.0.0.0/8"]
    )


def make_worker(source, version):
    now = timezone.now()
    return Worker.objects.create(
        source=source,
        namespace="rl-a",
        component="backend",
        endpoint="generate",
        instance_id="7",
        weight_version=version,
        first_seen_at=now,
        last_seen_at=now,
    )


def test_the_worker_page_links_its_version(source, viewer_client):
    worker = make_worker(source, "step-77")
    page = viewer_client.get(f"/workers/{worker.pk}/").content.decode()
    assert '<dd id="worker-version">' + LINK.format(v="step-77") in page


def test_an_undeclared_version_is_not_a_link(source, viewer_client):
    worker = make_worker(source, None)
    page = viewer_client.get(f"/workers/{worker.pk}/").content.decode()
    assert '<dd id="worker-version"><code>undeclared</code>' in page


def test_the_held_banner_and_the_gate_badges_link_versions(source, viewer_client):
    held = PolicyRefresh.objects.create(
        source=source,
        namespaces=["rl-a"],
        target={"weight_version": "step-88"},
        state=RefreshState.HELD,
        held_reason="update failed",
    )
    Gate.objects.create(
        source=source, namespace="rl-a", state=GateState.CLOSED, active_refresh=held
    )
    Gate.objects.create(
        source=source, namespace="rl-b", state=GateState.OPEN, verified_version="step-66"
    )
    page = viewer_client.get(f"/sources/{source.pk}/").content.decode()
    banner = page.split(f'id="refresh-banner-{source.pk}"', 1)[1].split("</div>", 1)[0]
    assert f"to {LINK.format(v='step-88')}:" in banner
    badges = page.split('<span class="gate-badges">', 1)[1].split("</span>\n", 1)[0]
    assert f"rl-b open · {LINK.format(v='step-66')}</span>" in badges
