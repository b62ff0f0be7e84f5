"""The refresh list: one table with duration and outcome, filters as GET parameters, bounded
pages, and the "awaiting your approval" cue for the person who may approve."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.urls import reverse

from controlplane.accounts.roles import Role
from controlplane.accounts.services import create_user_with_role
from controlplane.fleet.models import Source
from controlplane.refresh.list_views import PAGE_SIZE
from controlplane.refresh.models import PolicyRefresh, RefreshState
from tests.conftest import PASSWORD

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)


def _source(name: str) -> Source:
    return Source.objects.create(
        name=name, listener_url="http://127.0.0.1:9/", allowed_networks=["127.0.0.0/8"]
    )


def _refresh(source, state, *, by=None, label="", created=T0, started=None, finished=None, **kw):
    """A refresh row as the intents leave it (the list only reads rows)."""
    r = PolicyRefresh.objects.create(
        source=source,
        namespaces=["rl-a"],
        target={"weight_version": kw.pop("version", "v2"), "method": "disk"},
        state=state,
        requested_by=by,
        requested_by_label=label or (by.get_username() if by else "webhook:trainer"),
        started_at=started,
        finished_at=finished,
        **kw,
    )
    PolicyRefresh.objects.filter(pk=r.pk).update(created_at=created)
    return r


def _rows(html: str) -> list[int]:
    """The refresh ids of the table's rows, in order."""
    import re

    return [int(pk) for pk in re.findall(r'<tr id="refresh-row-(\d+)"', html)]


def _get(client, **query) -> str:
    response = client.get(reverse("refresh:list"), query)
    assert response.status_code == 200
    return response.content.decode()


def test_one_table_with_outcome_and_duration_columns(viewer_client, operator):
    sim = _source("sim")
    ok = _refresh(
        sim, RefreshState.SUCCEEDED, by=operator, started=T0, finished=T0 + timedelta(seconds=84)
    )
    failed = _refresh(
        sim,
        RefreshState.FAILED,
        by=operator,
        started=T0,
        finished=T0 + timedelta(seconds=5),
        failed_step="update",
    )
    discarded = _refresh(sim, RefreshState.ABORTED, by=operator, finished=T0)
    planned = _refresh(sim, RefreshState.PLANNED, by=operator)
    html = _get(viewer_client)
    assert html.count("<table") == 1
    assert '<th scope="col">Outcome</th>' in html and ">Duration</th>" in html
    assert _rows(html) == [planned.pk, discarded.pk, failed.pk, ok.pk]  # newest first
    row = html.split(f'id="refresh-row-{ok.pk}"')[1].split("</tr>")[0]
    assert "verified" in row and "1 min 24 s" in row
    row = html.split(f'id="refresh-row-{failed.pk}"')[1].split("</tr>")[0]
    assert "failed" in row and "at update" in row and "5.0 s" in row
    row = html.split(f'id="refresh-row-{discarded.pk}"')[1].split("</tr>")[0]
    assert 'class="badge discarded"' in row and "never started" in row and "—" in row
    # The rows travel live over the list's own stream, opened for this very query.
    assert 'ws-connect="/ws/refresh-list/?"' in html


def test_filters_by_state_source_who_and_since(viewer_client, operator, approver):
    sim, other = _source("sim"), _source("other")
    a = _refresh(sim, RefreshState.SUCCEEDED, by=operator, created=T0 - timedelta(days=3))
    b = _refresh(sim, RefreshState.HELD, by=approver, created=T0)
    c = _refresh(other, RefreshState.SUCCEEDED, label="webhook:trainer-7", created=T0)
    d = _refresh(sim, RefreshState.ABORTED, by=operator, created=T0)  # discarded: never started
    e = _refresh(
        sim, RefreshState.ABORTED, by=operator, created=T0, started=T0, finished=T0
    )  # aborted after it ran

    assert _rows(_get(viewer_client, state="succeeded")) == [c.pk, a.pk]
    assert _rows(_get(viewer_client, state="discarded")) == [d.pk]
    assert _rows(_get(viewer_client, state="aborted")) == [e.pk]
    assert _rows(_get(viewer_client, source="other")) == [c.pk]
    assert _rows(_get(viewer_client, who="trainer")) == [c.pk]
    assert _rows(_get(viewer_client, who="APPROVER")) == [b.pk]
    since = (T0 - timedelta(days=1)).date().isoformat()
    assert _rows(_get(viewer_client, since=since, source="sim")) == [e.pk, d.pk, b.pk]
    html = _get(viewer_client, state="held", source="sim")
    assert _rows(html) == [b.pk]
    assert 'ws-connect="/ws/refresh-list/?state=held&amp;source=sim"' in html


def test_a_bad_filter_says_so_and_lists_nothing(viewer_client, operator):
    _refresh(_source("sim"), RefreshState.SUCCEEDED, by=operator)
    for query in ({"state": "exploded"}, {"source": "nope"}, {"since": "last tuesday"}):
        html = _get(viewer_client, **query)
        assert 'class="form-error"' in html, query
        assert _rows(html) == [], query
        assert "No refresh matches these filters." in html


def test_pages_are_bounded_and_keep_the_filters(viewer_client, operator):
    sim = _source("sim")
    made = [_refresh(sim, RefreshState.SUCCEEDED, by=operator).pk for _ in range(PAGE_SIZE + 3)]
    first = _get(viewer_client, state="succeeded")
    assert _rows(first) == sorted(made, reverse=True)[:PAGE_SIZE]
    assert f"1\N{EN DASH}{PAGE_SIZE} of {PAGE_SIZE + 3}" in first
    assert 'href="?state=succeeded&amp;page=2"' in first
    second = _get(viewer_client, state="succeeded", page=2)
    assert _rows(second) == sorted(made, reverse=True)[PAGE_SIZE:]
    assert 'href="?state=succeeded&amp;page=1"' in second
    # A page past the end shows the last page, never an error.
    assert _rows(_get(viewer_client, state="succeeded", page=99)) == _rows(second)


def test_awaiting_your_approval_cue_only_for_who_may_approve_it(
    client, operator, approver, viewer_client
):
    sim = _source("sim")
    others = _refresh(sim, RefreshState.AWAITING_APPROVAL, by=operator)
    own = _refresh(sim, RefreshState.AWAITING_APPROVAL, by=approver)
    client.login(username=approver.username, password=PASSWORD)
    html = _get(client)
    assert f'id="refresh-row-{others.pk}" data-state="awaiting_approval" class="awaits-me"' in html
    assert f'id="refresh-row-{own.pk}" data-state="awaiting_approval">' in html  # four eyes
    assert html.count("awaiting your approval</a>") == 1
    # A viewer may approve nothing: no cue at all.
    assert "awaits-me" not in _get(viewer_client)


def test_list_queries_do_not_grow_with_the_page(
    viewer_client, operator, django_assert_max_num_queries
):
    sim = _source("sim")
    for _ in range(3):
        _refresh(sim, RefreshState.SUCCEEDED, by=operator)
    with django_assert_max_num_queries(12) as few:
        _get(viewer_client)
    for _ in range(30):
        _refresh(sim, RefreshState.SUCCEEDED, by=operator)
    with django_assert_max_num_queries(len(few.captured_queries)):
        _get(viewer_client)


def test_an_admin_also_gets_the_cue(client, operator):
    admin = create_user_with_role("admin-2", Role.ADMIN, PASSWORD, validate=False)
    waiting = _refresh(_source("sim"), RefreshState.AWAITING_APPROVAL, by=operator)
    client.login(username=admin.username, password=PASSWORD)
    cue = f'id="refresh-row-{waiting.pk}" data-state="awaiting_approval" class="awaits-me"'
    assert cue in _get(client)
