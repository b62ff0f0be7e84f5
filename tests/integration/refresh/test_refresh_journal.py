"""The refresh page's journal: filtered by result, worker and step, paged, in the URL; each grid
cell links to its worker's calls at its step."""

from __future__ import annotations

import json
import re
from html import unescape

import pytest
from django.test import Client
from django.urls import reverse

from controlplane.accounts.tokens import create_token
from controlplane.audit.recorder import Actor
from controlplane.refresh import presenters
from controlplane.refresh.models import JournalEntry
from controlplane.refresh.templatetags import refresh_tags
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


# -- a fleet-wide call's body: cut short on the page, whole in the API --------------------------


def _fleet_wide_call(refresh, keys: int) -> JournalEntry:
    """A listener read journaled at the reopen: its reply names every worker in scope."""
    at = refresh.started_at
    return JournalEntry.objects.create(
        refresh=refresh,
        step="reopen",
        operation="listener",
        method="GET",
        url="http://127.0.0.1:9/v1/rl/workers",
        http_status=200,
        response_body={"in_scope": [f"rl-0/backend/generate/{i:020d}" for i in range(keys)]},
        ok=True,
        duration_ms=3.0,
        started_at=at,
        finished_at=at,
        lease_token=1,
    )


def _row_of(section: str, call: JournalEntry) -> str:
    link = reverse("intake:api-v1:get_refresh_call", args=[call.refresh_id, call.pk])
    start = section.rindex("<tr ", 0, section.index(link))
    return section[start : section.index("</tr>", start)]


def test_a_fleet_wide_body_is_cut_short_on_the_page_and_whole_in_the_api(refresh, viewer_client):
    small = _fleet_wide_call(refresh, 10)
    big = _fleet_wide_call(refresh, 10_000)  # ~530 KB indented
    section, _ = journal_rows(viewer_client, refresh)

    row = _row_of(section, big)
    whole = json.dumps(big.response_body, ensure_ascii=False, indent=2, sort_keys=True)
    shown = unescape(row[row.index("response: ") + len("response: ") :])
    assert shown.startswith(whole[: refresh_tags.BODY_PREVIEW_CHARS] + "\n… ")
    assert f"{len(whole) - refresh_tags.BODY_PREVIEW_CHARS} more characters" in shown
    assert len(row) < 2 * refresh_tags.BODY_PREVIEW_CHARS + 2_000
    # The short one is shown whole, with no link.
    small_key = "rl-0/backend/generate/00000000000000000009"
    assert small_key in section
    assert reverse("intake:api-v1:get_refresh_call", args=[refresh.pk, small.pk]) not in section

    # The link: the whole call, for a signed-in viewer as for a token.
    link = re.search(r'<a class="whole-call" href="([^"]+)"', row).group(1)
    answer = viewer_client.get(unescape(link))
    assert answer.status_code == 200
    assert answer.json()["response_body"] == big.response_body
    assert answer.json()["step"] == "reopen" and answer.json()["worker"] is None


def _journal_api(client, refresh, query: str = "", **headers):
    url = reverse("intake:api-v1:list_refresh_journal", args=[refresh.pk])
    return client.get(url + (f"?{query}" if query else ""), **headers)


def test_the_api_pages_through_every_call_once_oldest_first(refresh, viewer_client):
    expected = list(JournalEntry.objects.filter(refresh=refresh).order_by("id"))
    seen, offset = [], 0
    while True:
        page = _journal_api(viewer_client, refresh, f"limit=40&offset={offset}").json()
        assert page["count"] == len(expected) == 150
        seen += page["items"]
        offset += 40
        if offset >= page["count"]:
            break
    assert [c["id"] for c in seen] == [c.pk for c in expected]
    first = expected[0]
    assert seen[0]["worker"] == first.planned_worker.key
    assert seen[0]["request_body"] == first.request_body and seen[0]["method"] == first.method

    failed = _journal_api(viewer_client, refresh, "ok=false&limit=500").json()
    assert failed["count"] == 10 and {c["step"] for c in failed["items"]} == {"update"}
    pauses = _journal_api(viewer_client, refresh, "step=pause&limit=500").json()
    assert pauses["count"] == 100 and {c["step"] for c in pauses["items"]} == {"pause"}
    detail = viewer_client.get(reverse("intake:api-v1:get_refresh", args=[refresh.pk])).json()
    assert detail["journal_url"] == reverse("intake:api-v1:list_refresh_journal", args=[refresh.pk])


def test_the_journal_api_answers_for_its_own_refresh_and_sources_only(
    refresh, viewer, viewer_client
):
    other = make_refresh(make_source("other"), 2)
    call = JournalEntry.objects.filter(refresh=other).first()
    # A call of another refresh is not this refresh's.
    url = reverse("intake:api-v1:get_refresh_call", args=[refresh.pk, call.pk])
    assert viewer_client.get(url).status_code == 404
    assert (
        viewer_client.get(
            reverse("intake:api-v1:get_refresh_call", args=[other.pk, call.pk])
        ).status_code
        == 200
    )
    # A token limited to the other source sees neither this refresh's journal nor its calls.
    _, secret = create_token(
        user=viewer, label="other-only", actor=Actor.system("test"), sources=[other.source]
    )
    headers = {"HTTP_AUTHORIZATION": f"Bearer {secret}"}
    assert _journal_api(Client(), refresh, **headers).status_code == 404
    assert _journal_api(Client(), other, **headers).json()["count"] == len(
        JournalEntry.objects.filter(refresh=other)
    )
    mine = JournalEntry.objects.filter(refresh=refresh).first()
    theirs = reverse("intake:api-v1:get_refresh_call", args=[refresh.pk, mine.pk])
    assert Client().get(theirs, **headers).status_code == 404
