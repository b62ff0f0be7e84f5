"""The gate poll answered in front of Django (`intake.api.fast_gate`): the same bytes and
headers as Django's answer, and everything uncertain handed to Django.

Transactional: Django's side runs its view in another thread, which must see the rows."""

import asyncio
import time

import pytest
from django.core.asgi import get_asgi_application
from django.test import Client

from controlplane import redis_client
from controlplane.accounts import tokens
from controlplane.accounts.models import ApiToken
from controlplane.audit.recorder import Actor
from controlplane.intake.api import fast_gate
from controlplane.refresh import gate_cache, gates
from controlplane.refresh.models import Gate, GateState
from tests.api.conftest import bearer

pytestmark = [pytest.mark.django_db(transaction=True)]

GATE = "/api/v1/gates/src-a/rl-a"
DJANGO = get_asgi_application()


class CountingDjango:
    """Django's ASGI app, counting the requests the fast path handed over."""

    def __init__(self, app=DJANGO):
        self.calls = 0
        self.app = app

    async def __call__(self, scope, receive, send):
        self.calls += 1
        await self.app(scope, receive, send)


def _call(app, path: str, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }
    sent: list[dict] = []
    received: list[bool] = []

    async def receive():
        if not received:
            received.append(True)
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.Event().wait()  # the client stays connected (Django cancels this)

    async def send(message):
        sent.append(message)

    async def run():
        await app(scope, receive, send)
        # Each asyncio.run has its own loop: close this loop's Redis client with it.
        await redis_client.async_client().aclose()

    asyncio.run(run())
    start = sent[0]
    body = b"".join(m.get("body", b"") for m in sent[1:])
    names = [k.decode().lower() for k, _ in start["headers"]]
    assert len(names) == len(set(names)), "a header sent twice"
    return start["status"], {k.decode().lower(): v.decode() for k, v in start["headers"]}, body


@pytest.fixture
def polled(fleet, viewer, token_factory):
    """A viewer token whose grant and gate copy are in Redis (after one Django answer)."""
    secret = token_factory(viewer, label="poller")
    assert Client().get(GATE, **bearer(secret)).status_code == 200
    return secret


def _headers(secret: str, **more: str) -> dict[str, str]:
    return {"Host": "127.0.0.1", "Authorization": f"Bearer {secret}", **more}


def _comparable(headers: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k != "x-request-id"}


@pytest.mark.parametrize("conditional", [False, True], ids=["200", "304"])
def test_the_fast_answer_is_djangos_answer(polled, conditional):
    django = CountingDjango()
    fast = fast_gate.wrap(django)
    _, first, _ = _call(DJANGO, GATE, _headers(polled))
    extra = {"If-None-Match": first["etag"]} if conditional else {}
    status, headers, body = _call(fast, GATE, _headers(polled, **extra))
    assert django.calls == 0, "answered in front of Django"
    expected = _call(DJANGO, GATE, _headers(polled, **extra))
    assert status == expected[0] == (304 if conditional else 200)
    assert body == expected[2]
    assert _comparable(headers) == _comparable(expected[1])
    assert len(headers["x-request-id"]) == 32


def test_an_offered_request_id_is_echoed(polled):
    fast = fast_gate.wrap(CountingDjango())
    _, headers, _ = _call(fast, GATE, _headers(polled, **{"X-Request-ID": "trainer-42-abc"}))
    assert headers["x-request-id"] == "trainer-42-abc"


def test_a_changed_gate_is_served_at_its_new_revision(polled, fleet):
    fast = fast_gate.wrap(CountingDjango())
    _, before, _ = _call(fast, GATE, _headers(polled))
    gates.force_open([fleet["gate"]], actor=Actor.system(), refresh=None, reason="ops")
    status, after, body = _call(fast, GATE, _headers(polled, **{"If-None-Match": before["etag"]}))
    assert status == 200 and after["etag"] != before["etag"]
    assert b'"state": "open_forced"' in body


def test_a_grant_and_copy_about_to_lapse_are_rebuilt_while_the_poll_is_answered(polled, fleet):
    key = tokens.grant_key(tokens.key_id_of(polled) or "")
    grant = tokens.Grant.decode(redis_client.sync_client().get(key))
    assert grant is not None
    redis_client.sync_client().set(
        key, tokens.Grant(**{**grant.__dict__, "refresh_at": 0.0}).encode()
    )
    copy_key = gate_cache.gate_key("src-a", "rl-a")
    revision, source_id, _, mark, body = redis_client.sync_client().get(copy_key).split(b" ", 4)
    redis_client.sync_client().set(copy_key, b" ".join([revision, source_id, b"0", mark, body]))
    # What the database says now and the copy does not (words changed outside the gate writer).
    Gate.objects.filter(pk=fleet["gate"].pk).update(reason="held: disk full")
    django = CountingDjango()
    fast_gate._claimed.clear()
    status, _, answered = _call(fast_gate.wrap(django), GATE, _headers(polled))
    assert status == 200 and django.calls == 0  # answered from the due copies ...
    assert b"disk full" not in answered
    rebuilt = tokens.Grant.decode(redis_client.sync_client().get(key))  # ... and both rebuilt
    assert rebuilt is not None and not rebuilt.due(time.time())
    copy = gate_cache.read("src-a", "rl-a")
    assert copy is not None and not copy.due(time.time())
    assert copy.payload()["reason"] == "held: disk full"


def test_a_revoked_token_is_refused_at_once(polled):
    django = CountingDjango()
    fast = fast_gate.wrap(django)
    assert _call(fast, GATE, _headers(polled))[0] == 200
    tokens.revoke_token(ApiToken.objects.get(label="poller"), actor=Actor.system())
    status, _, body = _call(fast, GATE, _headers(polled))
    assert status == 401 and b"unauthenticated" in body
    assert django.calls == 1  # Django (the database) said no


def test_a_token_limited_to_one_source_is_refused_another(fleet, viewer, token_factory):
    other = Gate.objects.create(source=fleet["b"], namespace="rl-b", state=GateState.OPEN)
    gates.force_open([other], actor=Actor.system(), refresh=None, reason="b is fine")
    assert gate_cache.read("src-b", "rl-b") is not None
    secret = token_factory(viewer, label="a-only", sources=[fleet["a"]])
    assert Client().get(GATE, **bearer(secret)).status_code == 200  # grant cached
    django = CountingDjango()
    fast = fast_gate.wrap(django)
    status, _, body = _call(fast, "/api/v1/gates/src-b/rl-b", _headers(secret))
    assert status == 404 and b"not_found" in body
    assert django.calls == 1


@pytest.mark.parametrize("missing", ["copy", "grant", "both"])
def test_a_missing_grant_or_copy_is_loaded_in_front_of_django(polled, missing):
    expected = _call(DJANGO, GATE, _headers(polled))
    if missing in ("copy", "both"):
        redis_client.sync_client().delete(gate_cache.gate_key("src-a", "rl-a"))
    if missing in ("grant", "both"):
        redis_client.sync_client().delete(tokens.grant_key(tokens.key_id_of(polled) or ""))
    django = CountingDjango()
    status, _, body = _call(fast_gate.wrap(django), GATE, _headers(polled))
    assert (status, body, django.calls) == (200, expected[2], 0)
    assert gate_cache.read("src-a", "rl-a") is not None


def test_an_unknown_token_loads_nothing_and_goes_to_django(polled):
    redis_client.sync_client().delete(gate_cache.gate_key("src-a", "rl-a"))
    unknown = "cpt_0123456789ab_" + "A" * 43
    django = CountingDjango()
    status, _, _ = _call(fast_gate.wrap(django), GATE, _headers(unknown))
    assert status == 401 and django.calls == 1
    assert gate_cache.read("src-a", "rl-a") is None  # no gate loaded for a refused token


@pytest.mark.parametrize("case", ["bad host", "basic auth", "forged secret", "other path"])
def test_anything_uncertain_goes_to_django(polled, case):
    headers = _headers(polled)
    path = GATE
    if case == "bad host":
        headers["Host"] = "evil.example"
    elif case == "basic auth":
        headers["Authorization"] = "Basic Zm9vOmJhcg=="
    elif case == "forged secret":
        headers["Authorization"] = f"Bearer {polled[:-4]}AAAA"
    else:
        path = GATE + "/force-reopen"
    django = CountingDjango()
    status, _, _ = _call(fast_gate.wrap(django), path, headers)
    assert django.calls == 1
    expected = {
        "bad host": 400,
        "basic auth": 401,
        "forged secret": 401,
        "other path": 405,
    }
    assert status == expected[case]


def test_a_redirect_to_https_is_left_to_django(polled, settings):
    settings.SECURE_SSL_REDIRECT = True
    django = CountingDjango(get_asgi_application())  # middleware reads settings when built
    status, headers, _ = _call(fast_gate.wrap(django), GATE, _headers(polled))
    assert (status, django.calls) == (301, 1)
    assert headers["location"].startswith("https://")


def test_behind_a_tls_proxy_the_fast_answer_carries_djangos_hsts(polled, settings):
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    settings.SECURE_SSL_REDIRECT = True
    settings.SECURE_HSTS_SECONDS = 3600
    headers = _headers(polled, **{"X-Forwarded-Proto": "https"})
    django = CountingDjango()
    status, fast, body = _call(fast_gate.wrap(django), GATE, headers)
    assert (status, django.calls) == (200, 0)
    expected = _call(get_asgi_application(), GATE, headers)  # built under these settings
    assert fast["strict-transport-security"] == "max-age=3600"
    assert (_comparable(fast), body) == (_comparable(expected[1]), expected[2])
