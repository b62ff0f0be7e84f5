"""Fleet pages: permissions on every mutating view, forms, and constant query counts."""

from __future__ import annotations

import pytest
from django.urls import reverse
from django.utils import timezone

from controlplane.audit.models import AuditEvent
from controlplane.audit.recorder import Actor
from controlplane.fleet import services
from controlplane.fleet.models import Source, StaticWorker, Worker, WorkerState

SOURCE_POST = {
    "name": "prod",
    "listener_url": "http://10.0.0.5:8001",
    "allowed_networks": "10.0.0.0/8",
    "discovery_interval_seconds": "10",
    "enabled": "on",
}


@pytest.fixture
def source(db):
    return services.create_source(
        actor=Actor.system("test"),
        name="src",
        listener_url="http://10.0.0.5:8001",
        allowed_networks=["10.0.0.0/8"],
        expected_prefix="rl",
    )


@pytest.fixture
def static(source):
    return services.add_static_worker(
        source,
        actor=Actor.system("test"),
        name="sg",
        namespace="rl-a",
        system_url="http://10.0.0.9:9000",
        family="sglang",
        allowed_routes=["pause_generation"],
    )


def _workers(source, n: int, *, start: int = 0) -> None:
    now = timezone.now()
    Worker.objects.bulk_create(
        Worker(
            source=source,
            namespace=f"rl-{i % 3}",
            component="backend",
            endpoint="rl",
            instance_id=str(2**63 + i),
            routes=[
                "get_weight_version",
                "pause_generation",
                "resume_generation",
                "update_weights_from_disk",
            ],
            family="vllm",
            system_url=f"http://10.0.1.{i % 250}:9000",
            weight_version=f"v{i % 2}",
            version_probed_at=now,
            state=WorkerState.LIVE,
            first_seen_at=now,
            last_seen_at=now,
        )
        for i in range(start, start + n)
    )


def _mutations(source, static):
    return [
        ("post", reverse("fleet:source_create"), SOURCE_POST),
        ("post", reverse("fleet:source_edit", args=[source.pk]), SOURCE_POST),
        ("post", reverse("fleet:source_delete", args=[source.pk]), {}),
        ("post", reverse("fleet:run_discovery", args=[source.pk]), {}),
        ("post", reverse("fleet:static_worker_create", args=[source.pk]), {}),
        ("post", reverse("fleet:static_worker_delete", args=[static.pk]), {}),
    ]


def test_viewer_gets_403_on_every_mutating_view_and_nothing_changes(viewer_client, source, static):
    before = AuditEvent.objects.count()
    for method, url, data in _mutations(source, static):
        response = getattr(viewer_client, method)(url, data)
        assert response.status_code == 403, url
    assert Source.objects.count() == 1 and StaticWorker.objects.count() == 1
    assert AuditEvent.objects.count() == before


def test_operator_cannot_manage_sources_but_can_run_discovery(operator_client, source, static):
    for method, url, data in _mutations(source, static):
        response = getattr(operator_client, method)(url, data)
        expected = 302 if url.endswith("/discovery/") else 403
        assert response.status_code == expected, url
    assert AuditEvent.objects.filter(action="discovery.requested").count() == 1


def test_anonymous_is_sent_to_login(client, source, static):
    urls = [reverse("fleet:overview"), reverse("fleet:source", args=[source.pk])]
    urls += [url for _, url, _ in _mutations(source, static)]
    for url in urls:
        response = client.post(url) if "/discovery/" in url or "delete" in url else client.get(url)
        assert response.status_code == 302 and "/accounts/login/" in response["Location"], url


def test_admin_creates_source_through_the_form_and_it_is_audited(admin_client):
    response = admin_client.post(reverse("fleet:source_create"), SOURCE_POST)
    source = Source.objects.get(name="prod")
    assert response.status_code == 302
    assert response["Location"] == reverse("fleet:source", args=[source.pk])
    event = AuditEvent.objects.get(action="source.created")
    assert event.actor_label == "admin-1"


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("listener_url", "not a url", "http"),
        ("allowed_networks", "10.0.0.0/40", "invalid CIDR"),
        ("discovery_interval_seconds", "0.2", "at least 1"),
    ],
)
def test_bad_form_input_shows_the_error_and_changes_nothing(admin_client, field, value, message):
    response = admin_client.post(reverse("fleet:source_create"), {**SOURCE_POST, field: value})
    assert response.status_code == 400
    assert message in response.content.decode()
    assert not Source.objects.exists()
    assert not AuditEvent.objects.filter(action="source.created").exists()


def test_admin_edits_and_deletes_a_source(admin_client, source):
    response = admin_client.post(
        reverse("fleet:source_edit", args=[source.pk]),
        {**SOURCE_POST, "name": "src", "discovery_interval_seconds": "30"},
    )
    assert response.status_code == 302
    source.refresh_from_db()
    assert source.discovery_interval_seconds == 30
    changed = AuditEvent.objects.get(action="source.updated").details["changed"]
    assert changed["discovery_interval_seconds"] == [10.0, 30.0]
    admin_client.post(reverse("fleet:source_delete", args=[source.pk]))
    assert not Source.objects.exists()


def test_admin_adds_a_static_worker(admin_client, source):
    response = admin_client.post(
        reverse("fleet:static_worker_create", args=[source.pk]),
        {
            "name": "sg",
            "namespace": "rl-a",
            "component": "backend",
            "system_url": "http://10.0.0.9:9000",
            "family": "sglang",
            "allowed_routes": "pause_generation, continue_generation",
        },
    )
    assert response.status_code == 302
    assert StaticWorker.objects.get().allowed_routes == ["continue_generation", "pause_generation"]
    assert AuditEvent.objects.filter(action="static_worker.added").exists()


def test_source_page_shows_workers_routes_and_capabilities(viewer_client, source):
    _workers(source, 3)
    html = viewer_client.get(reverse("fleet:source", args=[source.pk])).content.decode()
    assert str(2**63 + 1) in html  # exact instance id
    assert "disk update ✔" in html and "distributed update ✘" in html
    assert "prefix <code>rl</code>" in html and "`" not in html  # the scope explanation
    assert "Run discovery" not in html  # viewers get no button


def test_source_page_filters_and_sorts(viewer_client, source):
    _workers(source, 6)
    url = reverse("fleet:source", args=[source.pk])
    html = viewer_client.get(url, {"namespace": "rl-1"}).content.decode()
    assert html.count('<tr id="worker-') == 2
    html = viewer_client.get(
        url, {"version": "v1", "sort": "-identity"}, headers={"HX-Request": "true"}
    ).content.decode()
    # identity sorts by namespace first: rl-2 (5), rl-1 (1), rl-0 (3), descending
    ids = [str(2**63 + i) for i in (5, 1, 3)]
    positions = [html.index(i) for i in ids]
    assert positions == sorted(positions)
    assert "<html" not in html  # htmx gets the partial only


def test_source_page_query_count_does_not_grow_with_workers(
    viewer_client, source, django_assert_max_num_queries
):
    url = reverse("fleet:source", args=[source.pk])
    _workers(source, 10)
    viewer_client.get(url)  # warm the session and permission caches alike
    # Session, user, permissions, source, page count and rows, aggregates, filter choices,
    # timeline, static workers, the gate slot (refresh app), the latest discovery run's
    # rejected listener entries and the published policy the lag is read against: constant,
    # whatever the size.
    with django_assert_max_num_queries(27) as small:
        viewer_client.get(url)
    _workers(source, 1990, start=10)
    with django_assert_max_num_queries(len(small.captured_queries)) as large:
        response = viewer_client.get(url)
    assert response.content.decode().count('<tr id="worker-') == 100  # one page
    assert len(large.captured_queries) == len(small.captured_queries)


def test_overview_shows_counts_and_version_skew(viewer_client, source):
    _workers(source, 4)
    html = viewer_client.get(reverse("fleet:overview")).content.decode()
    assert "2 live" not in html and "4 live" in html
    assert "version skew" in html


def test_worker_page(viewer_client, source):
    _workers(source, 1)
    worker = Worker.objects.get()
    html = viewer_client.get(reverse("fleet:worker", args=[worker.pk])).content.decode()
    assert worker.instance_id in html and worker.system_url in html


def test_metrics_are_low_cardinality_and_loopback_only(client, source):
    _workers(source, 3)
    body = client.get("/metrics", REMOTE_ADDR="127.0.0.1").content.decode()
    assert 'controlplane_workers{source="src",state="live"} 3' in body
    assert str(2**63) not in body and "v1" not in body
    assert client.get("/metrics", REMOTE_ADDR="10.1.2.3").status_code == 403


def test_discovery_is_called_discovery_not_refresh(operator_client, source):
    """ "Refresh" on these pages means a policy refresh (a weight update); asking the
    listener for the fleet is discovery."""
    source.last_discovery_finished_at = timezone.now()
    source.save(update_fields=["last_discovery_finished_at"])
    overview = operator_client.get(reverse("fleet:overview")).content.decode()
    assert "<dt>Last discovery</dt>" in overview and "Last refresh" not in overview
    page = operator_client.get(reverse("fleet:source", args=[source.pk])).content.decode()
    assert ">Run discovery</button>" in page and "Refresh now" not in page
    assert "<dt>Discovery</dt><dd>every" in page
    queued = operator_client.post(
        reverse("fleet:run_discovery", args=[source.pk]), headers={"HX-Request": "true"}
    )
    assert "Discovery requested" in queued.content.decode()


def test_worker_history_and_source_form_say_discovery(viewer_client, admin_client, source):
    _workers(source, 1)
    worker = Worker.objects.get()
    html = viewer_client.get(reverse("fleet:worker", args=[worker.pk])).content.decode()
    assert "<th>Details</th><th>Discovery</th>" in html
    form = admin_client.get(reverse("fleet:source_create")).content.decode()
    assert "Discovery interval (s)" in form and "Refresh interval" not in form


def test_admin_declares_backend_families_and_a_bad_one_is_refused(admin_client, source):
    url = reverse("fleet:source_edit", args=[source.pk])
    response = admin_client.post(
        url,
        {
            **SOURCE_POST,
            "name": "src",
            "declared_family": "vllm-sidecar",
            "declared_families": "rl-b=sglang-sidecar\n",
        },
    )
    assert response.status_code == 302
    source.refresh_from_db()
    assert (source.declared_family, source.declared_families) == (
        "vllm-sidecar",
        {"rl-b": "sglang-sidecar"},
    )
    assert source.declared_family_for("rl-a") == "vllm-sidecar"
    assert source.declared_family_for("rl-b") == "sglang-sidecar"
    # The edit form shows the declarations back, so a save keeps them.
    page = admin_client.get(url).content.decode()
    assert "rl-b=sglang-sidecar" in page

    bad = admin_client.post(url, {**SOURCE_POST, "name": "src", "declared_families": "rl-c=trtllm"})
    assert bad.status_code == 400
    assert "declared family &#x27;trtllm&#x27; is unknown" in bad.content.decode()
    source.refresh_from_db()
    assert source.declared_families == {"rl-b": "sglang-sidecar"}
