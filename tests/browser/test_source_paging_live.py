"""A person filters and pages a big source page, and sees a live row update arrive there."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connections

from controlplane.audit.recorder import Actor
from controlplane.fleet import live, services
from controlplane.fleet.filters import WorkerFilter
from controlplane.fleet.models import Worker
from tests.conftest import PASSWORD
from tests.fixtures.live_server import sign_in
from tests.fixtures.scale import make_fleet

pytestmark = pytest.mark.browser


def _change_elsewhere(pks: list[int], error: str) -> None:
    """Change rows and publish as a discovery refresh does, on another thread: Playwright's
    sync API keeps an event loop in this one, and `publish` must run where none is running."""

    def run() -> None:
        try:
            Worker.objects.filter(pk__in=pks).update(error=error)
            live.publish_refresh(Worker.objects.get(pk=pks[0]).source_id, pks)
        finally:
            connections.close_all()

    with ThreadPoolExecutor(1) as pool:
        pool.submit(run).result()


def test_filter_and_page_the_source_page_then_a_row_there_updates_live(page, viewer):
    source = services.create_source(
        actor=Actor.system("test"),
        name="big",
        listener_url="http://10.0.0.5:8001",
        allowed_networks=["10.0.0.0/8"],
    )
    make_fleet(source, 500)  # 125 workers per namespace: two pages of rl-1
    second = list(WorkerFilter(namespace="rl-1", page=2).page_of(source).object_list)
    first_page_row = WorkerFilter(namespace="rl-1").page_of(source).object_list[0]
    target = second[7]

    sign_in(page, viewer.username, PASSWORD)
    page.goto(f"/sources/{source.pk}/")
    page.wait_for_selector("#workers[data-live=open]")
    page.evaluate("window.__notReloaded = true")
    assert page.locator("#worker-rows tr").count() == 100

    page.select_option("select[name=namespace]", "rl-1")
    page.wait_for_url("**namespace=rl-1**")
    page.locator("nav.pager", has_text="1\u2013100 of 125").wait_for()
    page.click("nav.pager a[rel=next]")
    page.wait_for_url("**page=2**")
    page.locator("nav.pager", has_text="101\u2013125 of 125").wait_for()
    page.wait_for_selector("#workers[data-live=open]")  # the page's own socket, following it
    assert page.locator("#worker-rows tr").count() == 25
    assert page.locator(f"#worker-{target.pk}").count() == 1

    _change_elsewhere([target.pk, first_page_row.pk], "liveness probe timed out")

    page.locator(f"#worker-{target.pk}", has_text="liveness probe timed out").wait_for()
    # The page-1 row did not land here; the page says other pages changed instead.
    page.locator("#workers-notice", has_text="on other pages").wait_for()
    assert page.locator("#worker-rows tr").count() == 25
    assert page.locator(f"#worker-{first_page_row.pk}").count() == 0
    assert page.evaluate("window.__notReloaded") is True  # same document: no reload
    assert "namespace=rl-1" in page.url and "page=2" in page.url  # the view is a link
