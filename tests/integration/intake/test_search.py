"""Global search (`/search/?q=`): what each kind of query finds, where each hit links, that
the page costs the same queries however many rows match, and who may use it."""

from __future__ import annotations

import re
from urllib.parse import urlencode

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from controlplane.fleet.models import Source, Worker
from controlplane.intake.search import LIMIT, search
from controlplane.refresh.models import PolicyRefresh

pytestmark = pytest.mark.django_db

U64 = "18446744073709551615"


def make_source(name: str) -> Source:
    return Source.objects.create(
        name=name, listener_url="http://127.0.0.1:9/", allowed_networks=["127.0.0.0/8"]
    )


def make_worker(source, namespace, instance_id, version=None, component="backend") -> Worker:
    now = timezone.now()
    return Worker.objects.create(
        source=source,
        namespace=namespace,
        component=component,
        endpoint="generate",
        instance_id=instance_id,
        weight_version=version,
        first_seen_at=now,
        last_seen_at=now,
    )


def make_refresh(source, version, **fields) -> PolicyRefresh:
    return PolicyRefresh.objects.create(
        source=source,
        namespaces=["rl-a"],
        target={"weight_version": version, "method": "disk", "model_path": "/m"},
        **fields,
    )


@pytest.fixture
def world(db):
    a, b = make_source("src-a"), make_source("src-b")
    return {
        "a": a,
        "b": b,
        "big": make_worker(a, "rl-a", U64, "step-1200"),
        "small": make_worker(a, "rl-a", "7", "step-1100"),
        "other": make_worker(b, "rl-b", "1844674", 1300),
        "r1": make_refresh(a, "step-1200"),
        "r2": make_refresh(b, 1300),
    }


def q(client, text: str) -> str:
    response = client.get("/search/?" + urlencode({"q": text}))
    assert response.status_code == 200
    return response.content.decode()


def section(page: str, group: str) -> str:
    """The HTML of one result group, or "" when the page has none."""
    match = re.search(rf'<section[^>]*id="search-{group}".*?</section>', page, re.S)
    return match.group(0) if match else ""


def test_a_whole_worker_key_finds_that_worker_and_links_its_page(world, viewer_client):
    page = q(viewer_client, world["big"].key)
    workers = section(page, "workers")
    assert f'href="/workers/{world["big"].pk}/"' in workers
    assert f"/workers/{world['small'].pk}/" not in workers
    assert section(page, "instances") == "" and section(page, "refreshes") == ""


def test_hits_show_the_workers_url_and_link_their_source(world, viewer_client):
    Worker.objects.filter(pk=world["big"].pk).update(system_url="http://10.0.0.7:9090")
    workers = section(q(viewer_client, world["big"].key), "workers")
    assert "<code>http://10.0.0.7:9090</code>" in workers
    assert f'<a href="/sources/{world["a"].pk}/">src-a</a>' in workers
    refreshes = section(q(viewer_client, f"#{world['r2'].pk}"), "refreshes")
    assert f'<a href="/sources/{world["b"].pk}/">src-b</a>' in refreshes


def test_a_key_prefix_matches_leading_parts_exactly_and_the_last_as_a_prefix(world):
    assert {w.pk for w in search("rl-a/backend/generate/").workers.hits} == {
        world["big"].pk,
        world["small"].pk,
    }
    assert [w.pk for w in search("rl-a/backend/generate/18").workers.hits] == [world["big"].pk]
    # "rl" is a namespace prefix; "backend" alone is not a namespace.
    assert len(search("rl").workers.hits) == 3
    assert search("backend").workers.hits == []
    assert search("rl-a/back/generate").workers.hits == []  # a leading part must be whole
    assert search("a/b/c/d/e").workers.hits == []


def test_digits_find_instance_ids_by_prefix_and_a_refresh_by_id(world, viewer_client):
    page = q(viewer_client, "1844")
    instances = section(page, "instances")
    assert f'href="/workers/{world["big"].pk}/"' in instances
    assert f'href="/workers/{world["other"].pk}/"' in instances
    assert f"/workers/{world['small'].pk}/" not in instances

    r1 = world["r1"]
    for text in (str(r1.pk), f"#{r1.pk}", f"policy-refresh-{r1.pk}"):
        refreshes = section(q(viewer_client, text), "refreshes")
        assert f'href="/refreshes/{r1.pk}/"' in refreshes, text
        assert f'href="/refreshes/{world["r2"].pk}/"' not in refreshes


def test_a_version_prefix_links_each_version_to_its_provenance(world, viewer_client):
    versions = section(q(viewer_client, "step-1"), "versions")
    assert 'href="/versions/step-1200/provenance/"' in versions
    assert 'href="/versions/step-1100/provenance/"' in versions
    hits = {v.version: v for v in search("step-1").versions.hits}
    assert hits["step-1200"].targeted and hits["step-1200"].reported
    assert not hits["step-1100"].targeted and hits["step-1100"].reported
    # A version sent as a number is found by its text.
    assert [v.version for v in search("130").versions.hits] == ["1300"]


def test_source_ids_limit_every_group(world):
    limited = search("1", source_ids=[world["a"].pk])
    assert world["other"].pk not in {w.pk for w in limited.instances.hits}
    assert all(r.source_id == world["a"].pk for r in limited.refreshes.hits)
    assert "1300" not in {v.version for v in limited.versions.hits}
    assert search(f"#{world['r2'].pk}", source_ids=[world["a"].pk]).refreshes.hits == []


def test_each_group_stops_at_the_limit_and_says_there_is_more(world, viewer_client):
    for n in range(LIMIT + 5):
        make_worker(world["a"], "rl-many", str(1000 + n))
    found = search("rl-many")
    assert len(found.workers.hits) == LIMIT and found.workers.more
    assert "More workers match" in q(viewer_client, "rl-many")


def _queries(client, text: str) -> int:
    with CaptureQueriesContext(connection) as ctx:
        q(client, text)
    return len(ctx.captured_queries)


def test_the_page_costs_the_same_queries_with_many_matches(world, viewer_client):
    texts = ("rl-x", "1", f"#{world['r1'].pk}", "step-")
    few = [_queries(viewer_client, t) for t in texts]
    a = world["a"]
    for n in range(60):
        make_worker(a, "rl-x", f"1{n:03d}", f"step-9{n:03d}", component=f"c{n % 3}")
        make_refresh(a, f"step-8{n:03d}")
    many = [_queries(viewer_client, t) for t in texts]
    assert many == few


def test_a_signed_in_person_without_the_view_permission_is_refused(world):
    nobody = get_user_model().objects.create_user("nobody", password="x")
    client = Client()
    client.force_login(nobody)
    assert client.get("/search/?q=rl").status_code == 403
    assert Client().get("/search/?q=rl").status_code == 302  # to sign in


def test_an_empty_or_overlong_query_answers_without_hits(world, viewer_client):
    assert "Press <kbd>/</kbd>" in q(viewer_client, "   ")
    page = q(viewer_client, "x" * 5000)
    assert "Nothing matches" in page


def test_the_top_bar_search_box_is_on_every_page(world, viewer_client):
    page = viewer_client.get("/").content.decode()
    assert re.search(r'<form class="topsearch" role="search" method="get" action="/search/">', page)
    assert 'id="global-search"' in page and 'aria-keyshortcuts="/"' in page
