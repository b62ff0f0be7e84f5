"""The live pages are clean: no console error, no page error and no htmx error event on any
page a person watches while a refresh runs (issue 27, "the live pages are clean")."""

from __future__ import annotations

import pytest

from controlplane.accounts.roles import Role
from controlplane.accounts.services import create_user_with_role
from controlplane.fleet.models import Worker
from controlplane.refresh.models import JournalEntry, PolicyRefresh, RefreshState
from controlplane.refresh.tasks import execute_policy_refresh
from tests.conftest import PASSWORD
from tests.fixtures.live_server import sign_in
from tests.integration.refresh.helpers import fleet_config, make_source, sync_workers

#: Every htmx error event (htmx 2 names them so); each is recorded before htmx logs it.
HTMX_ERRORS = [
    "htmx:oobErrorNoTarget",
    "htmx:responseError",
    "htmx:sendError",
    "htmx:swapError",
    "htmx:targetError",
    "htmx:onLoadError",
    "htmx:historyCacheError",
    "htmx:wsError",
]
LISTEN = "window.__htmxErrors = [];" + "".join(
    f"document.addEventListener({name!r}, (e) => window.__htmxErrors.push("
    f"{name!r} + ' ' + ((e.detail && (e.detail.error || (e.detail.content && "
    "e.detail.content.id) || (e.detail.xhr && e.detail.xhr.status))) || '')));"
    for name in HTMX_ERRORS
)


@pytest.fixture
def fleet_source(simfleet_factory, transactional_db):
    fleet = simfleet_factory(fleet_config(6))
    from controlplane.simfleet import Fault

    # Slow updates: the pages are watched mid-refresh, while pushes arrive.
    for worker in fleet.workers():
        fleet.inject(worker["key"], "update_weights_from_disk", Fault.latency(0.5))
    source = make_source(fleet)
    sync_workers(source)
    return source


def test_no_console_or_htmx_error_on_any_live_page_during_a_refresh(
    page, fleet_source, celery_worker
):
    problems: list[str] = []
    page.on(
        "console",
        lambda m: m.type in ("error", "warning") and problems.append(f"{m.type}: {m.text}"),
    )
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    # A request cut short by leaving the page (net::ERR_ABORTED) is the browser's doing.
    page.on(
        "requestfailed",
        lambda r: (
            "ERR_ABORTED" not in (r.failure or "")
            and problems.append(f"request failed: {r.url} {r.failure}")
        ),
    )
    page.on(
        "response",
        lambda r: r.status >= 400 and problems.append(f"HTTP {r.status}: {r.url}"),
    )
    page.add_init_script(LISTEN)
    create_user_with_role("op", Role.OPERATOR, PASSWORD, validate=False)
    sign_in(page, "op", PASSWORD)

    page.goto("/refreshes/new/")
    page.select_option("#id_source", fleet_source.name)
    page.fill("#id_weight_version", "v7")
    page.fill("#id_model_path", "/ckpt/v7")
    page.click("form.plan-form button[type=submit]")
    page.wait_for_url("**/refreshes/*/", timeout=30_000)
    page.click("#confirm-refresh")
    page.wait_for_selector(".live-dot.connected")
    refresh = PolicyRefresh.objects.get(source=fleet_source)
    assert refresh.state == RefreshState.GATING
    execute_policy_refresh.delay(refresh.pk)  # see test_refresh_live: the server's queue
    page.wait_for_selector("#refresh-state[data-state=succeeded]", timeout=60_000)
    # The journal's counter followed the calls as they arrived, without a reload.
    calls = JournalEntry.objects.filter(refresh=refresh).count()
    assert calls > 0
    page.wait_for_function(
        f"document.getElementById('journal-count').textContent.trim() === '{calls} calls'"
    )
    assert page.locator("#journal-empty").is_hidden()
    # Phase and per-worker lane labels sit inside their charts: none is cut off on the left.
    page.wait_for_selector("#refresh-timeline svg .chart-label")
    cut = page.evaluate(
        """[...document.querySelectorAll('#refresh-timeline svg text.chart-label')]
             .filter((t) => t.getBBox().x < 0).map((t) => t.textContent)"""
    )
    assert cut == []
    seen = {f"/refreshes/{refresh.pk}/": page.evaluate("window.__htmxErrors")}

    worker = Worker.objects.filter(source=fleet_source).first()
    for path in (
        "/",
        f"/sources/{fleet_source.pk}/",
        f"/workers/{worker.pk}/",
        "/refreshes/",
        "/refreshes/gates/",
        "/history/",
        f"/search/?q={worker.instance_id}",
        f"/refreshes/{refresh.pk}/",
    ):
        page.goto(path)
        page.wait_for_load_state("networkidle")
        seen[path] = page.evaluate("window.__htmxErrors")

    assert {path: errors for path, errors in seen.items() if errors} == {}
    assert problems == [], "\n".join(problems)


def test_a_one_time_secret_has_a_copy_button(page, transactional_db, live_server_url):
    """A new token's secret is copied with one click (our own script: no inline JS)."""
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=live_server_url)
    create_user_with_role("adm", Role.ADMIN, PASSWORD, validate=False)
    sign_in(page, "adm", PASSWORD)
    page.goto("/admin-tools/tokens/new/")
    page.fill("#id_label", "run-9")
    page.select_option("#id_user", label="adm")
    page.click("main form.form button[type=submit]")
    page.wait_for_url("**/created/")
    secret = page.locator("#secret").inner_text().strip()
    page.click("#copy-secret")
    page.wait_for_selector("#copy-secret-status:has-text('Copied.')")
    assert page.evaluate("navigator.clipboard.readText()") == secret
    page.reload()  # post/redirect/get: nothing is created again, the secret is gone
    assert "/admin-tools/tokens/" in page.url and secret not in page.content()
