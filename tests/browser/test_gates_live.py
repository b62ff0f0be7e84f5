"""A person watches the Gates page while gates change underneath it: rows update in place."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from django.db import connections, transaction
from django.utils import timezone

from controlplane.audit.recorder import Actor
from controlplane.fleet.models import Source
from controlplane.refresh import freshness, gates
from controlplane.refresh.models import Gate, GateState
from tests.conftest import PASSWORD
from tests.fixtures.live_server import sign_in

pytestmark = pytest.mark.browser


def _elsewhere(fn) -> None:
    """Change gates on another thread: Playwright's sync API keeps an event loop in this one,
    and `publish` (sync-to-async) must run where no loop is running — as in a Celery worker."""

    def run() -> None:
        try:
            with transaction.atomic():
                fn()
        finally:
            connections.close_all()

    with ThreadPoolExecutor(1) as pool:
        pool.submit(run).result()


def test_gates_page_follows_gate_changes_without_reloading(page, approver):
    source = Source.objects.create(
        name="sim",
        listener_url="http://127.0.0.1:9/",
        allowed_networks=["127.0.0.0/8"],
        last_success_at=timezone.now(),
    )
    verified = Gate.objects.create(
        source=source, namespace="rl-a", state=GateState.OPEN, verified_instances=["1", "2"]
    )
    held = Gate.objects.create(source=source, namespace="rl-b", state=GateState.CLOSED, reason="x")

    sign_in(page, approver.username, PASSWORD)
    page.goto("/refreshes/gates/")
    page.wait_for_selector(".live-dot.connected")
    page.evaluate("window.__sameDocument = true")  # gone if the page reloads
    assert page.locator(f"#gate-{verified.pk} .badge").inner_text() == "open"

    # The source's last discovery is now too old: the beat task's pass marks it unknown.
    Source.objects.filter(pk=source.pk).update(last_success_at=timezone.now() - timedelta(hours=1))
    _elsewhere(freshness.sync_all)
    page.wait_for_selector(f"#gate-{verified.pk}[data-state=unknown]")
    row = page.locator(f"#gate-{verified.pk}")
    assert row.locator(".badge").inner_text() == "unknown"
    assert "no successful discovery since" in row.inner_text()

    # An approver force-reopens the held gate elsewhere (the API, the CLI): the row shows who,
    # why, and a badge that is not the verified one; its form is fetched for this user.
    _elsewhere(
        lambda: gates.force_open(
            [held], actor=Actor.system("cli:ops"), refresh=None, reason="eval run waits"
        )
    )
    page.wait_for_selector(f"#gate-{held.pk}[data-state=open_forced]")
    held_row = page.locator(f"#gate-{held.pk}")
    assert held_row.locator(".badge").inner_text() == "open (forced)"
    assert "eval run waits" in held_row.inner_text()
    assert "forced by cli:ops at" in held_row.inner_text()
    assert page.evaluate("window.__sameDocument") is True
