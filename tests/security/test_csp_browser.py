"""In Chromium: a hostile model path on the approver's page runs nothing and trips no CSP
report, htmx and the live websocket still work under the policy, and the policy really does
block an inline script that gets into the page."""

from __future__ import annotations

import pytest

from controlplane.refresh import intents
from controlplane.refresh.models import RefreshState
from tests.conftest import PASSWORD
from tests.fixtures.live_server import sign_in
from tests.integration.refresh.helpers import actor_for, fleet_config, make_source, sync_workers

pytestmark = pytest.mark.browser

#: Collects CSP violations and console errors from the first script on every document.
WATCH = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__cspViolations.push(e.violatedDirective + " " + e.blockedURI);
});
"""
#: Each one sets a window flag if it ever runs.
MODEL_PATH = (
    "/c/</code><script>window.__xss='script'</script>"
    '"><img src=x onerror="window.__xss=\'img\'">\u202e'
)


@pytest.fixture
def approver_page(page, approver):
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.add_init_script(WATCH)
    sign_in(page, approver.username, PASSWORD)
    page.console_errors = errors
    return page


@pytest.fixture
def source(simfleet_factory, transactional_db):
    source = make_source(simfleet_factory(fleet_config(3)))
    sync_workers(source)
    return source


def _clean(page) -> None:
    assert page.evaluate("window.__xss") is None, "injected script ran"
    assert page.evaluate("window.__cspViolations") == []
    assert [e for e in page.console_errors if "Content Security Policy" in e] == []


def test_hostile_model_path_on_the_plan_preview_runs_nothing(approver_page, source, operator):
    page = approver_page
    refresh = intents.plan_policy_refresh(
        source=source,
        actor=actor_for(operator),
        target={"weight_version": "v2", "method": "disk", "model_path": MODEL_PATH},
    )
    assert refresh.state == RefreshState.PLANNED
    page.goto(f"/refreshes/{refresh.pk}/")
    # Shown as text inside the call body, exactly as it will be sent (calls are folded).
    page.locator("details.worker-calls summary").first.click()
    page.locator(
        ".plan-calls pre.json", has_text="<script>window.__xss='script'</script>"
    ).first.wait_for()
    assert page.locator("img").count() == 0
    _clean(page)

    # The second line of defence: an inline script that reaches the DOM is refused.
    page.evaluate(
        """() => { const s = document.createElement("script");
                   s.textContent = "window.__inline = true"; document.body.append(s); }"""
    )
    page.wait_for_function("window.__cspViolations.length > 0")
    assert page.evaluate("window.__inline") is None
    assert page.evaluate("window.__cspViolations")[0].startswith("script-src")


def test_htmx_and_the_live_socket_work_under_the_policy(approver_page, source):
    page = approver_page
    page.goto(f"/sources/{source.pk}/")
    page.wait_for_selector(".live-dot.connected")  # ws extension connected (connect-src)
    rows = page.locator("#worker-rows tr")
    assert rows.count() == 3
    page.evaluate("window.__sameDocument = true")
    page.select_option("select[name=namespace]", "rl-a")  # htmx hx-get swap of #workers
    page.wait_for_url("**namespace=rl-a**")
    page.wait_for_function("document.querySelectorAll('#worker-rows tr').length === 1")
    assert page.evaluate("window.__sameDocument") is True
    _clean(page)
