"""No page scrolls horizontally at 1440 or 390 px, for any role.

Every page is visited with a fleet, a refresh that ran, one awaiting approval and one planned
(so tables, grids, journals and badges are full), by a viewer, an operator, an approver and an
admin, at a desktop and a phone width. A page fits when the document is no wider than the
window (`document.scrollingElement.scrollWidth <= innerWidth`): wide tables scroll inside their
own box. Pages a role may not see render the 403 page, which must fit too.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connections

from controlplane.accounts.roles import Role
from controlplane.accounts.services import create_user_with_role
from controlplane.intake.models import WebhookEndpoint
from controlplane.notify.models import NotificationDestination
from controlplane.refresh import intents
from tests.conftest import PASSWORD
from tests.fixtures.live_server import sign_in
from tests.integration.refresh.helpers import actor_for, make_source, plan, run_inline

pytestmark = pytest.mark.browser

WIDTHS = {"desktop": (1440, 900), "phone": (390, 844)}
ROLES = [Role.VIEWER, Role.OPERATOR, Role.APPROVER, Role.ADMIN]
#: Restructured on another branch now (the cockpit header): checked here, fixed there.
REFRESH_PAGES = ("detail", "plan preview", "plan form", "gates")
RESTRUCTURED = "refresh pages restructured on another branch"


def _elsewhere(fn):
    """Run `fn` on another thread (Playwright keeps an event loop in this one)."""

    def run():
        try:
            return fn()
        finally:
            connections.close_all()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(run).result()


def _world(simfleet) -> dict[str, str]:
    """A fleet, refreshes in three states, a webhook endpoint: every page, by name → URL."""
    operator = create_user_with_role("requester", Role.OPERATOR, PASSWORD, validate=False)
    source = make_source(simfleet, require_approval=False)

    def build():
        ran = run_inline(source, operator, version="v-wide-checkpoint-2026-11-30")
        source.require_approval = True
        source.save(update_fields=["require_approval"])
        waiting = plan(source, operator, "v-awaiting", namespaces=["rl-a"])
        intents.start_policy_refresh(waiting, actor=actor_for(operator), enqueue=False)
        planned = plan(source, operator, "v-planned", namespaces=["rl-b"])
        return ran, waiting, planned

    ran, waiting, planned = _elsewhere(build)
    endpoint = WebhookEndpoint.objects.create(name="trainer-a", source=source, secrets=["x" * 32])
    destination = NotificationDestination.objects.create(
        name="ops-hook",
        kind="webhook",
        url="http://127.0.0.1:9/hooks/a-rather-long-path/that-goes-on/and-on",
        allowed_networks=["127.0.0.0/8"],
    )
    worker = source.workers.first()
    return {
        "fleet": "/",
        "source": f"/sources/{source.pk}/",
        "source map": f"/sources/{source.pk}/map/",
        "source edit": f"/sources/{source.pk}/edit/",
        "source delete": f"/sources/{source.pk}/delete/",
        "source new": "/sources/new/",
        "static worker new": f"/sources/{source.pk}/static-workers/new/",
        "worker": f"/workers/{worker.pk}/",
        "refreshes": "/refreshes/",
        "refreshes filtered": "/refreshes/?state=succeeded&who=requester",
        "inbox": "/refreshes/inbox/",
        "strategy": f"/refreshes/sources/{source.pk}/strategy/",
        "history": "/history/",
        "provenance": f"/versions/{ran.weight_version}/provenance/",
        "search": "/search/?q=rl",
        "admin": "/admin-tools/",
        "tokens": "/admin-tools/tokens/",
        "token new": "/admin-tools/tokens/new/",
        "webhooks": "/admin-tools/webhooks/",
        "webhook new": "/admin-tools/webhooks/new/",
        "webhook": f"/admin-tools/webhooks/{endpoint.pk}/",
        "webhook edit": f"/admin-tools/webhooks/{endpoint.pk}/edit/",
        "webhook delete": f"/admin-tools/webhooks/{endpoint.pk}/delete/",
        "notifications": "/admin-tools/notifications/",
        "notification new": "/admin-tools/notifications/new/",
        "notification": f"/admin-tools/notifications/{destination.pk}/",
        "notification edit": f"/admin-tools/notifications/{destination.pk}/edit/",
        "search empty": "/search/",
        "sign-in": "/accounts/login/",
        # No "not found" page here: this live server runs with DEBUG on, where Django answers a
        # 404 with its development page (every URL pattern, its own styles) instead of
        # templates/errors/404.html, which the demo and production (DEBUG off) show.
        # Restructured on another branch (REFRESH_PAGES).
        "detail": f"/refreshes/{ran.pk}/",
        "awaiting detail": f"/refreshes/{waiting.pk}/",
        "plan preview": f"/refreshes/{planned.pk}/",
        "plan form": "/refreshes/new/",
        "gates": "/refreshes/gates/",
    }


def _restructured(name: str) -> bool:
    return name in REFRESH_PAGES or name == "awaiting detail"


def _overflowing(page, pages: dict[str, str]) -> dict[str, str]:
    wide = {}
    for width, (w, h) in WIDTHS.items():
        page.set_viewport_size({"width": w, "height": h})
        for name, url in pages.items():
            page.goto(url)
            page.wait_for_load_state("load")
            scroll, inner = page.evaluate(
                "[document.scrollingElement.scrollWidth, window.innerWidth]"
            )
            if scroll > inner:
                wide[f"{name} @ {width}"] = f"{url}: {scroll} > {inner}; {_culprits(page)}"
    return wide


#: The deepest elements sticking out past the window's right edge (what to fix, in a failure).
CULPRITS = """() => {
  const out = [];
  for (const el of document.querySelectorAll("body *")) {
    const r = el.getBoundingClientRect();
    if (r.right <= window.innerWidth + 0.5 || r.width === 0) continue;
    const past = (c) => c.getBoundingClientRect().right > window.innerWidth + 0.5;
    if ([...el.children].some(past)) continue;
    const classes = typeof el.className === "string" ? el.className.trim() : "";
    const name = el.tagName.toLowerCase() + (el.id ? "#" + el.id : "") +
      (classes ? "." + classes.split(/\\s+/).join(".") : "");
    out.push(`${name} (right ${Math.round(r.right)})`);
  }
  return out.slice(0, 5).join(", ");
}"""


def _culprits(page) -> str:
    return page.evaluate(CULPRITS)


@pytest.mark.parametrize("role", ROLES, ids=[r.value for r in ROLES])
def test_no_page_scrolls_horizontally(page, simfleet, transactional_db, role):
    pages = _world(simfleet)
    user = create_user_with_role(f"{role.value}-wide", role, PASSWORD, validate=False)
    sign_in(page, user.username, PASSWORD)
    ours = {name: url for name, url in pages.items() if not _restructured(name)}
    assert _overflowing(page, ours) == {}
    page.goto("about:blank")


# The refresh pages, apart: they are restructured on another branch now; should one overflow
# there, its case is marked `xfail(reason=RESTRUCTURED)` until fixed.
@pytest.mark.parametrize("role", ROLES, ids=[r.value for r in ROLES])
def test_no_refresh_page_scrolls_horizontally(page, simfleet, transactional_db, role):
    pages = _world(simfleet)
    user = create_user_with_role(f"{role.value}-wide", role, PASSWORD, validate=False)
    sign_in(page, user.username, PASSWORD)
    theirs = {name: url for name, url in pages.items() if _restructured(name)}
    wide = _overflowing(page, theirs)
    page.goto("about:blank")
    assert wide == {}
