"""The refresh page's journal: filtered by result, worker and step, paged, in the URL; each grid
cell links to its worker's calls at its step."""

from __future__ import annotations

import re
from html import unescape

import pytest
from django.urls import reverse

from controlplane.refresh import presenters
from controlplane.refresh.models import JournalEntry
from tests.fixtures.scale import make_refresh, make_source

pytestmark = pytest.mark.django_db

JOURNAL_ROW = re.compile(
    r'<tr class="(failed)?">\s*<td>[^<]*</td>\s*<td><code>([^<]*)</code></td>\s*<td>(\w+)</td>'
)


@pytest.fixture
def refresh(db):
    return make_refresh(make_source("big"), 100)  # 100 pause calls, 50 update calls (10 failed)


def journal_rows(client, refresh, query: str = "", **headers) -> tuple[str, list[tuple]]:
    url = reverse("refresh:detail", args=[refresh.pk]) + (f"?{query}" if query else "")
    page = client.get(url, **headers).content.decode()
    section = page[page.index('id="refresh-journal"') :]
    return section, [(bool(f), unescape(k), s) for f, k, s in JOURNAL_ROW.findall(section)]


def test_failed_calls_only(refresh, viewer_client):
    section, rows = journal_rows(viewer_client, refresh, "j_state=failed")
    assert len(rows) == 10 and all(failed and step == "update" for failed, _, step in rows)
    assert "10 calls" in section and 'id="journal-rows-view"' in section
    # The call shows its path; the full URL (host and port) is in its title.
    assert re.search(
        r'<code title="http://10\.0\.[\d.]+:9000/engine/update_weights_from_disk">'
        r"POST /engine/update_weights_from_disk</code>",
        section,
    )
    _, ok_rows = journal_rows(viewer_client, refresh, "j_state=ok&j_step=update")
    assert len(ok_rows) == 40 and not any(failed for failed, _, _ in ok_rows)


def test_worker_and_step_filters_and_the_grid_links_to_them(refresh, viewer_client):
    worker = refresh.workers.order_by("namespace", "key", "pk").first()
    page = viewer_client.get(reverse("refresh:detail", args=[refresh.pk])).content.decode()
    link = f'href="?j_worker={worker.pk}&amp;j_step=update#refresh-journal"'
    assert link in page  # its update cell
    _, rows = journal_rows(viewer_client, refresh, f"j_worker={worker.pk}&j_step=update")
    expected = JournalEntry.objects.filter(planned_worker=worker, step="update").count()
    assert len(rows) == expected and {(k, s) for _, k, s in rows} <= {(worker.key, "update")}
    _, rows = journal_rows(viewer_client, refresh, f"j_worker={worker.pk}")
    assert {s for _, _, s in rows} == set(
        JournalEntry.objects.filter(planned_worker=worker).values_list("step", flat=True)
    )
    _, rows = journal_rows(viewer_client, refresh, "j_q=rl-1/&j_step=pause")
    assert len(rows) == 25 and all(k.startswith("rl-1/") for _, k, _ in rows)


def test_paging_reaches_every_call_once_and_htmx_gets_the_journal_alone(refresh, viewer_client):
    total = JournalEntry.objects.filter(refresh=refresh).count()
    seen: list[tuple] = []
    query = ""
    while True:
        section, rows = journal_rows(viewer_client, refresh, query)
        seen += rows
        found = re.search(r'<a class="journal-next" href="\?([^"#]+)#', section)
        if not found:
            break
        query = unescape(found.group(1))
    assert len(seen) == total == 150
    assert len(journal_rows(viewer_client, refresh)[1]) == presenters.JOURNAL_LIMIT

    response = viewer_client.get(
        reverse("refresh:detail", args=[refresh.pk]) + "?j_page=2&j_state=ok",
        HTTP_HX_REQUEST="true",
        HTTP_HX_TARGET="refresh-journal",
    )
    fragment = response.content.decode()
    assert fragment.lstrip().startswith('<section class="card" id="refresh-journal"')
    assert 'id="refresh-grid"' not in fragment and "<html" not in fragment
    assert "page 2 of 3" in fragment  # 140 ok calls, 50 a page


def test_bad_filter_values_show_everything_instead_of_failing(refresh, viewer_client):
    section, rows = journal_rows(viewer_client, refresh, "j_state=maybe&j_worker=x&j_page=-3")
    assert len(rows) == presenters.JOURNAL_LIMIT and 'id="journal-rows"' in section
