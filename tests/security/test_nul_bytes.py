"""NUL (U+0000) through every input channel of every route: a clear 400, never a 500, nothing
changed. Part of the hostile-strings suite: the routes are the ones it enumerates from the URL
configuration (`named_routes`), so a new route gets its NUL cases without being listed here.

PostgreSQL refuses NUL in text, varchar and jsonb, even as a query parameter; before the
refusal at the door (`controlplane/nul.py`, `dynamo.jsonsafe`), `/search/?q=%00` and
`/versions/a%00b/provenance/` answered 500.
"""

from __future__ import annotations

import json
import logging
import re
from urllib.parse import urlencode

import pytest
from asgiref.sync import async_to_sync
from django.apps import apps
from django.test import Client

from controlplane.accounts.tokens import create_token
from controlplane.audit.recorder import Actor
from controlplane.fleet import discovery
from controlplane.fleet.models import DiscoveryRun, DiscoveryTrigger, Source, Worker
from controlplane.intake.models import ReceivedWebhook, WebhookEndpoint
from controlplane.refresh import intents
from controlplane.refresh.executor import execute_refresh
from controlplane.refresh.models import Gate, RefreshState
from controlplane.simfleet import Fault, FleetConfig, WorkerSpec
from tests.integration.intake.conftest import SECRET, post_webhook
from tests.security.test_hostile_strings import named_routes

pytestmark = [pytest.mark.django_db]

_TEXT_PARAM = re.compile(r"<(?:(?:str|path|slug):)?(\w+)>")
_INT_PARAM = re.compile(r"<int:\w+>")
#: Form fields the views read (names, reasons, confirmations, free-text filters).
FORM = {"name": "a\x00b", "reason": "a\x00b", "confirm": "1", "q": "a\x00b", "label": "x"}


def counts() -> dict[str, int]:
    """Rows per table: "changed nothing" is every count unchanged (audit rows included)."""
    tables = [m for m in apps.get_models() if m._meta.managed and not m._meta.proxy]
    return {m._meta.label: m._default_manager.count() for m in tables}


@pytest.fixture
def world(admin_client):
    source = Source.objects.create(
        name="src-a", listener_url="http://127.0.0.1:9/", allowed_networks=["127.0.0.0/8"]
    )
    WebhookEndpoint.objects.create(name="trainer-a", source=source, secrets=[SECRET])
    return admin_client


def _path_with_nul(pattern: str) -> str:
    """The route's path with NUL where text goes: a text parameter if it has one (the URL
    converter is where `/versions/<version>/` passed it through), else an id, else a suffix."""
    if _TEXT_PARAM.search(pattern):
        path = _TEXT_PARAM.sub("a%00b", pattern, count=1)
    elif _INT_PARAM.search(pattern):
        path = _INT_PARAM.sub("1%00", pattern, count=1)
    else:
        path = pattern + "%00"
    return "/" + _INT_PARAM.sub("1", _TEXT_PARAM.sub("v", path))


def _plain_path(pattern: str) -> str:
    return "/" + _INT_PARAM.sub("1", _TEXT_PARAM.sub("v", pattern))


def _refused(response, where: str) -> str | None:
    """Why `response` is not the clear NUL refusal, or None when it is."""
    if response.status_code != 400:
        return f"{response.status_code}: {response.content[:200]!r}"
    body = response.content.decode()
    if "NUL" not in body or where not in body:
        return f"400 without naming NUL in the {where}: {body[:200]!r}"
    if response.wsgi_request.path.startswith("/api/"):
        error = json.loads(body)["error"]
        if error["code"] != "nul_character":
            return f"API error code {error['code']!r}"
    return None


def _check_every_route(send, where: str) -> None:
    before = counts()
    problems = {}
    routes = named_routes()
    for name, pattern in routes.items():
        if problem := _refused(send(pattern), where):
            problems[name] = problem
    assert not problems, problems
    assert counts() == before
    assert len(routes) > 100  # the enumeration found the project's routes


def test_nul_in_the_query_string_of_every_route(world):
    _check_every_route(lambda p: world.get(_plain_path(p) + "?q=a%00b&page=1"), "query string")
    _check_every_route(lambda p: world.get(_plain_path(p) + "?a%00=1"), "query string")


def test_nul_in_the_path_of_every_route(world):
    _check_every_route(lambda p: world.get(_path_with_nul(p)), "path")


def test_nul_in_a_form_field_of_every_route(world):
    urlencoded = urlencode(FORM)
    form = "application/x-www-form-urlencoded"
    _check_every_route(
        lambda p: world.post(_plain_path(p), urlencoded, content_type=form), "form field"
    )
    # The test client's default: multipart/form-data.
    _check_every_route(lambda p: world.post(_plain_path(p), FORM), "form field")


def test_nul_in_a_header(world):
    before = counts()
    response = world.get("/search/", {"q": "x"}, HTTP_X_REQUESTED_BY="a\x00b")
    assert _refused(response, "header") is None
    assert counts() == before


def test_nul_in_a_json_body_of_every_api_route(world):
    """Every API route answers in its error shape; the signed webhook route (checked below)
    verifies the signature first, so an unsigned body is a 400 for that."""
    body = json.dumps({"name": "a\x00b", "metrics": {"k\x00": 1}, "reason": "x"})
    assert "\\u0000" in body
    before = counts()
    problems = {}
    api = {n: p for n, p in named_routes().items() if n.startswith("intake:api-v1:")}
    for name, pattern in api.items():
        if "webhooks/trainer" in pattern:
            continue
        for method in (world.post, world.put, world.patch):
            response = method(_plain_path(pattern), body, content_type="application/json")
            if response.status_code != 400:
                problems[f"{name} {method.__name__}"] = (response.status_code, response.content)
            elif response.json()["error"]["code"] != "nul_character":
                problems[f"{name} {method.__name__}"] = response.json()
    assert not problems, problems
    assert counts() == before
    assert len(api) > 20


def test_nul_in_the_create_source_api_body_is_refused_before_the_database(world):
    body = {
        "name": "nul\x00name",
        "listener_url": "http://127.0.0.1:9/",
        "discovery_interval_seconds": 60,
    }
    before = counts()
    response = world.post("/api/v1/sources", json.dumps(body), content_type="application/json")
    assert response.status_code == 400, response.content
    assert response.json()["error"]["code"] == "nul_character"
    assert counts() == before


def test_nul_in_a_signed_webhook_body(world):
    event = {
        "type": "checkpoint.ready",
        "data": {"weight_version": "v\x00", "model_path": "/ckpt/v", "step": 1},
    }
    response = post_webhook(Client(), json.dumps(event).encode(), webhook_id="msg_nul_body")
    assert response.status_code == 400, response.content
    assert response.json()["error"]["code"] == "nul_character", response.content
    assert not ReceivedWebhook.objects.exists()


def test_nul_in_a_webhook_header(world):
    body = json.dumps({"type": "checkpoint.ready", "data": {}}).encode()
    before = counts()
    response = post_webhook(Client(), body, webhook_id="msg_\x00")
    assert _refused(response, "header") is None
    assert counts() == before


@pytest.mark.django_db(transaction=True)
def test_nul_in_discovery_payloads_and_worker_replies_is_refused_per_entry(
    simfleet_factory, admin_client
):
    """Worker replies are outside data too: an entry or reply holding NUL is that worker's
    problem (an error on its row), never a failed run or a 500 page."""
    config = FleetConfig(
        workers=[
            WorkerSpec(namespace="rl-a", model="m"),
            WorkerSpec(namespace="rl-a", model="m"),
            WorkerSpec(namespace="rl-a", model="m"),
            WorkerSpec(namespace="rl-a", component="nul\x00component", model="m"),
        ],
        listener_env={"DYN_NAMESPACE_PREFIX": "rl", "DYN_RL_REQUEST_TIMEOUT_SECS": "2"},
        seed=7,
    )
    fleet = simfleet_factory(config)
    keys = [w["key"] for w in fleet.workers()]
    fleet.inject(keys[0], "probe", Fault.probe_error("nul\x00error"))
    fleet.set_version(keys[1], "nul\x00version")
    fleet.inject(keys[2], "probe", Fault.reply({"status": "ok", "routes": ["nul\x00route"]}))
    source = Source.objects.create(
        name="sim",
        listener_url=fleet.listener_url,
        frontend_url=fleet.frontend_url,
        expected_prefix="rl",
        allowed_networks=["127.0.0.0/8"],
    )
    discovery.run_discovery(source.pk, trigger=DiscoveryTrigger.MANUAL, wait=15)
    run = DiscoveryRun.objects.get(source=source)
    assert run.ok, run.error
    # The entries holding NUL are refused with their reasons; the worker whose version reply
    # holds one is kept, with that as its version error.
    reasons = sorted(r["reason"] for r in run.rejected_entries)
    assert reasons == [
        "'component' contains a NUL character",
        "'error' contains a NUL character",
        "'routes' has an entry that contains a NUL character",
    ], run.rejected_entries
    workers = list(Worker.objects.filter(source=source))
    assert len(workers) == 1
    assert "NUL" in workers[0].version_error, workers[0].version_error
    pages = [f"/sources/{source.pk}/", "/", *(f"/workers/{w.pk}/" for w in workers)]
    for url in pages:
        response = admin_client.get(url)
        assert response.status_code == 200, (url, response.status_code)


@pytest.mark.django_db(transaction=True)
def test_nul_in_a_worker_reply_during_a_refresh_is_journaled_not_a_crash(
    simfleet_factory, admin_user, admin_client
):
    """An admin call's reply holding NUL is kept as the text it was (which no family accepts
    as success), so the journal's jsonb column can store it and the refresh holds."""
    config = FleetConfig(
        workers=[WorkerSpec(namespace="rl-a", model="m") for _ in range(2)],
        listener_env={"DYN_NAMESPACE_PREFIX": "rl", "DYN_RL_REQUEST_TIMEOUT_SECS": "2"},
        seed=8,
    )
    fleet = simfleet_factory(config)
    source = Source.objects.create(
        name="sim",
        listener_url=fleet.listener_url,
        frontend_url=fleet.frontend_url,
        expected_prefix="rl",
        allowed_networks=["127.0.0.0/8"],
    )
    discovery.run_discovery(source.pk, trigger=DiscoveryTrigger.MANUAL, wait=15)
    first = fleet.workers()[0]["key"]
    fleet.inject(first, "update_weights_from_disk", Fault.error("nul\x00body"))
    actor = Actor.for_user(admin_user)
    refresh = intents.plan_policy_refresh(
        source=source,
        actor=actor,
        target={"weight_version": "v2", "method": "disk", "model_path": "/ckpt/v2"},
        namespaces=["rl-a"],
    )
    assert not refresh.plan_blockers, refresh.plan_blockers
    intents.start_policy_refresh(refresh, actor=actor, enqueue=False)
    execute_refresh(refresh.pk)
    refresh.refresh_from_db()
    assert refresh.state == RefreshState.HELD, (refresh.state, refresh.held_reason)
    assert admin_client.get(f"/refreshes/{refresh.pk}/").status_code == 200


# -- in front of Django: the ASGI application as served ------------------------------------


@pytest.mark.django_db(transaction=True)
def test_nul_in_a_gate_poll_answered_in_front_of_django(world, viewer):
    """The fast gate reads the path before Django's middleware would: a poll with a good token
    looked the gate up by the path's names (a database error, logged) before Django answered.
    Now refused in front of both, in the API's shape; the token still polls a real gate."""
    from controlplane.asgi import application
    from tests.api.test_fast_gate import _call

    _, secret = create_token(user=viewer, label="poller", actor=Actor.system(), sources=())
    headers = {"Host": "127.0.0.1", "Authorization": f"Bearer {secret}"}
    errors: list[str] = []
    handler = logging.Handler(logging.ERROR)
    handler.emit = lambda record: errors.append(record.getMessage())  # type: ignore[method-assign]
    project = logging.getLogger("controlplane")  # its own handlers: root's caplog misses it
    project.addHandler(handler)
    before = counts()
    try:
        status, answered, body = _call(application, "/api/v1/gates/src\x00a/rl-a", headers)
    finally:
        project.removeHandler(handler)
    assert status == 400, body
    assert answered["content-type"].startswith("application/json")
    assert json.loads(body)["error"]["code"] == "nul_character"
    # Nothing looked the names up: no database error logged on the way.
    assert errors == []
    assert counts() == before
    Gate.objects.create(source=Source.objects.get(name="src-a"), namespace="rl-a")
    status, _, body = _call(application, "/api/v1/gates/src-a/rl-a", headers)
    assert status == 200, body


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "path",
    [
        "/ws/gates/?source=a%00b",
        "/ws/gate-table/?source=a%00b",
        "/ws/fleet/sources/1/?version=a%00b",
        "/ws/refreshes/1/?state=a%00b",
    ],
)
def test_nul_in_a_websocket_query_closes_it_before_it_opens(path, admin_user):
    from channels.testing import WebsocketCommunicator

    from controlplane.asgi import application

    async def connect():
        communicator = WebsocketCommunicator(application, path)
        communicator.scope["user"] = admin_user
        connected, code = await communicator.connect(timeout=10)
        await communicator.disconnect()
        return connected, code

    before = counts()
    assert async_to_sync(connect)() == (False, 4400)
    assert counts() == before
