"""The fleet map in a real browser: the script draws a square per present worker in its
colour, names each worker on hover and on keyboard focus, and opens it on click or Enter."""

from __future__ import annotations

import pytest
from django.urls import reverse

from controlplane.audit.recorder import Actor
from controlplane.fleet import services
from controlplane.fleet.models import Worker, WorkerState
from tests.conftest import PASSWORD
from tests.fixtures.live_server import sign_in
from tests.fixtures.scale import make_fleet

pytestmark = pytest.mark.browser

PITCH = 10  # a 9 px square and a 1 px gap (static/js/fleet_map.js)

# Every square's centre pixel as #rrggbb, and the page's colour for each class, read back
# through a canvas so both are in the same form.
_PIXELS = """
(map) => {
  const canvas = map.querySelector('canvas');
  const ctx = canvas.getContext('2d');
  const ratio = canvas.width / canvas.clientWidth;
  const columns = Number(map.dataset.columns);
  const hex = (d) => '#' + [d[0], d[1], d[2]].map((v) => v.toString(16).padStart(2, '0')).join('');
  const probe = document.createElement('canvas').getContext('2d', {willReadFrequently: true});
  const colour = (cls) => {
    probe.fillStyle = getComputedStyle(document.documentElement).getPropertyValue('--' + cls);
    probe.fillRect(0, 0, 1, 1);
    return hex(probe.getImageData(0, 0, 1, 1).data);
  };
  const at = (i) => hex(ctx.getImageData(Math.floor(((i % columns) * 10 + 4) * ratio),
                                         Math.floor((Math.floor(i / columns) * 10 + 4) * ratio),
                                         1, 1).data);
  const count = Number(map.dataset.drawn);
  const squares = [];
  for (let i = 0; i < count; i++) squares.push(at(i));
  const blank = at(count);
  return {squares, columns, blank, erroring: colour('chart-erroring'),
          versions: [0, 1, 2].map((v) => colour('chart-v' + v))};
}
"""


@pytest.fixture
def fleet(transactional_db):
    source = services.create_source(
        actor=Actor.system("test"),
        name="mapped",
        listener_url="http://10.0.0.5:8001",
        allowed_networks=["10.0.0.0/8"],
    )
    make_fleet(source, 25)  # 4 namespaces, versions step-0..2, every fifth erroring
    gone = Worker.objects.filter(source=source).order_by("pk").last()
    Worker.objects.filter(pk=gone.pk).update(state=WorkerState.GONE)
    workers = list(
        Worker.objects.filter(source=source)
        .exclude(state=WorkerState.GONE)
        .order_by("namespace", "component", "endpoint", "instance_id")
    )
    return source, workers


def test_every_worker_is_a_square_named_on_hover_and_focus_and_linked(page, viewer, fleet):
    source, workers = fleet
    sign_in(page, viewer.username, PASSWORD)
    asked: list[str] = []
    page.on("request", lambda request: asked.append(request.url))
    warnings: list[str] = []
    page.on("console", lambda message: warnings.append(message.text))
    page.goto(f"/sources/{source.pk}/")
    root = page.locator("#fleet-map-cells [data-fleet-map][data-drawn]")
    root.wait_for(state="attached")
    assert root.get_attribute("data-drawn") == str(len(workers)) == "24"
    expect_summary = f"24 workers: {sum(w.state == WorkerState.LIVE for w in workers)} live"
    assert page.locator(".fleet-map-summary").inner_text().startswith(expect_summary)
    # The data came once, from the URL the head preloads (the script's fetch was handed the
    # preloaded response, no second request), and not from the map fragment.
    data_url = reverse("fleet:source_map_data", args=[source.pk])
    assert [u for u in asked if "/map" in u] == [f"{page.url.split('/sources/')[0]}{data_url}"]
    assert not [w for w in warnings if "preload" in w], warnings
    legend = page.locator("#fleet-map-cells .fleet-map-legend li")
    assert legend.all_inner_texts()[-1].strip() == "erroring"
    assert {t.strip() for t in legend.all_inner_texts()} >= {w.weight_version for w in workers}
    assert (
        page.locator("#fleet-map-cells canvas")
        .get_attribute("aria-label")
        .startswith("Fleet map: 24 workers")
    )

    # Each square is painted: erroring workers in the erroring colour, live ones in their
    # version's (one colour per version, three distinct), and nothing after the last worker.
    drawn = root.evaluate(_PIXELS)
    colour_of: dict[str, str] = {}
    for worker, pixel in zip(workers, drawn["squares"], strict=True):
        if worker.state == WorkerState.ERRORING:
            assert pixel == drawn["erroring"], worker.key
        else:
            assert colour_of.setdefault(worker.weight_version, pixel) == pixel, worker.key
    assert sorted(colour_of.values()) == sorted(drawn["versions"])
    assert drawn["blank"] not in drawn["squares"]

    # Hovering a square names its worker (key · state · version) and points at its page.
    canvas = page.locator("#fleet-map-cells canvas")
    line = page.locator("#fleet-map-cells .fleet-map-focus")
    columns = drawn["columns"]
    for i, worker in enumerate(workers):
        canvas.hover(position={"x": (i % columns) * PITCH + 4, "y": (i // columns) * PITCH + 4})
        assert line.inner_text() == f"{worker.key} · {worker.state} · {worker.weight_version}"
        assert canvas.get_attribute("title") == line.inner_text()
        assert line.get_attribute("data-href") == reverse("fleet:worker", args=[worker.pk])

    # The keyboard: focus lands on the first worker, arrows move, Enter opens the worker.
    canvas.focus()
    assert line.inner_text().startswith(workers[0].key + " · ")
    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowRight")
    assert line.inner_text().startswith(workers[2].key + " · ")
    page.keyboard.press("Enter")
    page.wait_for_url(f"**{reverse('fleet:worker', args=[workers[2].pk])}")

    # A click opens the worker under the pointer.
    page.go_back()
    page.locator("#fleet-map-cells [data-fleet-map][data-drawn]").wait_for(state="attached")
    canvas.click(position={"x": 5 * PITCH + 4, "y": 4})
    page.wait_for_url(f"**{reverse('fleet:worker', args=[workers[5].pk])}")


def test_without_a_script_the_source_page_links_the_maps_own_page(
    _browser, live_server_url, viewer, fleet
):
    source, workers = fleet
    context = _browser.new_context(base_url=live_server_url, java_script_enabled=False)
    try:
        page = context.new_page()
        sign_in(page, viewer.username, PASSWORD)
        page.goto(f"/sources/{source.pk}/")
        link = page.locator("#fleet-map-cells .fleet-map-summary a")
        assert link.inner_text() == "Open the fleet map"
        assert page.locator("#fleet-map-cells canvas").is_hidden()  # no empty, focusable canvas
        link.click()
        page.wait_for_url(f"**{reverse('fleet:source_map', args=[source.pk])}")
        # The map's own page says in words what the map would show.
        assert (
            page.locator(".fleet-map-summary").inner_text().startswith(f"{len(workers)} workers: ")
        )
    finally:
        context.close()
