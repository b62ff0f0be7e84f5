"""A trainer's signed webhook refreshes the simulated fleet; a viewer opens the version's
provenance page and finds the checkpoint, the refresh, every worker and the open gate."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connections
from django.test import Client

from controlplane.intake.models import ReceivedWebhook, WebhookEndpoint, WebhookPolicy
from controlplane.intake.webhooks.trainer.process import process_delivery
from controlplane.refresh.executor import execute_refresh
from controlplane.refresh.models import PolicyRefresh, RefreshState
from tests.conftest import PASSWORD
from tests.fixtures.live_server import sign_in
from tests.integration.intake.conftest import SECRET, post_webhook
from tests.integration.refresh.helpers import make_source, sync_workers

pytestmark = pytest.mark.browser

DIGEST = "sha256:" + "9f" * 32


def _webhook_driven_refresh(fleet) -> PolicyRefresh:
    """Sign and deliver `checkpoint.ready`, plan and start it (the delivery task's work) and run
    the executor. On its own thread: Playwright keeps an event loop in this one."""

    def run() -> PolicyRefresh:
        try:
            source = make_source(fleet)
            sync_workers(source)
            WebhookEndpoint.objects.create(
                name="trainer-a", source=source, secrets=[SECRET], policy=WebhookPolicy.AUTO_START
            )
            body = json.dumps(
                {
                    "type": "checkpoint.ready",
                    "data": {
                        "weight_version": "step-2400",
                        "model_path": "/checkpoints/run-9/step-2400",
                        "step": 2400,
                        "metrics": {"eval/reward": 0.72},
                        "checkpoint_digest": DIGEST,
                    },
                }
            ).encode()
            answer = post_webhook(Client(), body, webhook_id="msg_browser_1")
            assert answer.status_code == 202, answer.content
            process_delivery(ReceivedWebhook.objects.get(webhook_id="msg_browser_1").pk)
            refresh = PolicyRefresh.objects.get(source=source)
            execute_refresh(refresh.pk)
            refresh.refresh_from_db()
            return refresh
        finally:
            connections.close_all()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(run).result()


def test_provenance_page_after_a_webhook_driven_refresh(page, simfleet, viewer, transactional_db):
    refresh = _webhook_driven_refresh(simfleet)
    assert refresh.state == RefreshState.SUCCEEDED, refresh.held_reason

    sign_in(page, viewer.username, PASSWORD)
    page.goto("/versions/step-2400/provenance/")
    assert page.locator("#provenance-version").inner_text() == "step-2400"
    checkpoint = page.locator("#checkpoints tr.checkpoint")
    assert checkpoint.count() == 1
    assert DIGEST in checkpoint.inner_text() and "msg_browser_1" in checkpoint.inner_text()
    assert "2400" in checkpoint.locator("td.num").inner_text()
    trail = page.locator(f"#refresh-{refresh.pk}")
    assert trail.locator("tr.worker-outcome.verified").count() == 4
    assert trail.locator("td.cell.failed").count() == 0
    windows = page.locator("#admission tr.admission-window[data-open=true]")
    assert windows.count() == len(refresh.namespaces)

    # The export is the API's JSON, readable with the same session.
    exported = page.request.get(page.locator("#export-json").get_attribute("href"))
    assert exported.ok
    body = exported.json()
    assert body["checkpoints"][0]["checkpoint_digest"] == DIGEST
    assert [r["id"] for r in body["refreshes"]] == [refresh.pk]
