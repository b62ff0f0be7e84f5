"""Every API endpoint by {anonymous, viewer, operator, approver, admin, token limited to another
source}: nobody gets a 2xx they are not entitled to, and nothing answers 5xx."""

import pytest
from django.test import Client

from controlplane.accounts.roles import Perm
from tests.api.conftest import bearer

# (method, path template, body, permission needed, scoped to source src-a)
ENDPOINTS = [
    ("get", "/api/v1/sources", None, Perm.VIEW, False),
    (
        "post",
        "/api/v1/sources",
        {"name": "new", "listener_url": "http://127.0.0.1:1/", "allowed_networks": ["127.0.0.0/8"]},
        Perm.MANAGE_SOURCES,
        None,
    ),
    ("get", "/api/v1/sources/src-a", None, Perm.VIEW, True),
    ("patch", "/api/v1/sources/src-a", {"enabled": False}, Perm.MANAGE_SOURCES, True),
    ("post", "/api/v1/sources/src-a/refresh", None, Perm.RUN_DISCOVERY, True),
    ("get", "/api/v1/workers", None, Perm.VIEW, False),
    ("get", "/api/v1/workers/{worker}", None, Perm.VIEW, True),
    ("get", "/api/v1/observations", None, Perm.VIEW, False),
    ("get", "/api/v1/observations/{run}", None, Perm.VIEW, True),
    ("get", "/api/v1/gates", None, Perm.VIEW, False),
    ("get", "/api/v1/gates/src-a/rl-a", None, Perm.VIEW, True),
    ("post", "/api/v1/gates/src-a/rl-a/force-reopen", {"reason": "x"}, Perm.FORCE_REOPEN, True),
    ("get", "/api/v1/refreshes", None, Perm.VIEW, False),
    (
        "post",
        "/api/v1/refreshes",
        {"source": "src-a", "target": {"weight_version": "v3", "model_path": "/m"}},
        Perm.OPERATE_REFRESH,
        True,
    ),
    ("get", "/api/v1/refreshes/{refresh}", None, Perm.VIEW, True),
    ("get", "/api/v1/refreshes/{refresh}/capacity", None, Perm.VIEW, True),
    ("get", "/api/v1/refreshes/{refresh}/journal", None, Perm.VIEW, True),
    # No call journaled yet: an entitled caller meets 404, never a 2xx of another's call.
    ("get", "/api/v1/refreshes/{refresh}/journal/1", None, Perm.VIEW, True),
    ("get", "/api/v1/refreshes/{refresh}/group?wait=0.2&after=x", None, Perm.VIEW, True),
    ("get", "/api/v1/refreshes/{refresh}/external", None, Perm.VIEW, True),
    # Not an external refresh waiting for a report: an entitled caller meets 409.
    (
        "post",
        "/api/v1/refreshes/{refresh}/applied",
        {"weight_version": "v2"},
        Perm.OPERATE_REFRESH,
        True,
    ),
    ("post", "/api/v1/refreshes/{refresh}/start", None, Perm.OPERATE_REFRESH, True),
    ("post", "/api/v1/refreshes/{refresh}/approve", None, Perm.APPROVE_REFRESH, True),
    ("post", "/api/v1/refreshes/{refresh}/reject", {"reason": "no"}, Perm.APPROVE_REFRESH, True),
    ("post", "/api/v1/refreshes/{refresh}/abort", {}, Perm.OPERATE_REFRESH, True),
    ("post", "/api/v1/refreshes/{refresh}/retry", None, Perm.OPERATE_REFRESH, True),
    ("post", "/api/v1/refreshes/{refresh}/rollback", None, Perm.OPERATE_REFRESH, True),
    ("post", "/api/v1/refreshes/{refresh}/end", {"reason": "x"}, Perm.APPROVE_REFRESH, True),
    # The gate is closed and a refresh holds it: an entitled caller meets 409, never a 2xx.
    ("post", "/api/v1/sources/src-a/drills", {}, Perm.OPERATE_REFRESH, True),
    ("get", "/api/v1/sources/src-a/drills", None, Perm.VIEW, True),
    ("get", "/api/v1/drills/{drill}", None, Perm.VIEW, True),
    # The refresh to v2 is src-a's: a token limited to src-b finds no record of v2 (404).
    ("get", "/api/v1/versions/v2/provenance", None, Perm.VIEW, True),
    ("get", "/api/v1/audit/events", None, Perm.VIEW, None),
    ("get", "/api/v1/audit/events/export", None, Perm.VIEW, None),
    ("delete", "/api/v1/sources/src-a", None, Perm.MANAGE_SOURCES, True),
]
PERSONAS = ["anonymous", "viewer", "operator", "approver", "admin", "limited_token"]


@pytest.fixture
def callers(fleet, viewer, operator, approver, admin_user, token_factory):
    def session(user):
        client = Client()
        client.force_login(user)
        return client, {}, user

    limited = token_factory(admin_user, label="limited", sources=[fleet["b"]])
    return {
        "anonymous": (Client(), {}, None),
        "viewer": session(viewer),
        "operator": session(operator),
        "approver": session(approver),
        "admin": session(admin_user),
        "limited_token": (Client(), bearer(limited), admin_user),
    }


def _call(client, method, path, body, headers):
    kwargs = {"content_type": "application/json"} if body is not None else {}
    import json

    data = json.dumps(body) if body is not None else None
    if data is None:
        return getattr(client, method)(path, **headers)
    return getattr(client, method)(path, data, **kwargs, **headers)


@pytest.mark.parametrize("persona", PERSONAS)
@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=lambda e: f"{e[0]} {e[1]}")
def test_no_unauthorised_2xx(callers, fleet, persona, endpoint):
    method, template, body, perm, scoped = endpoint
    path = template.format(
        worker=fleet["worker"].pk,
        run=fleet["run"].pk,
        refresh=fleet["refresh"].pk,
        drill=fleet["drill"].pk,
    )
    client, headers, user = callers[persona]
    response = _call(client, method, path, body, headers)
    status = response.status_code
    assert status < 500, response.content
    body_json = (
        response.json() if response.get("content-type", "").startswith("application/json") else None
    )
    if status >= 400 and body_json is not None:
        assert set(body_json["error"]) == {"code", "message", "details"}
    if persona == "anonymous":
        assert status == 401
        return
    entitled = user.has_perm(perm)
    if persona == "limited_token":
        if scoped is True or scoped is None:
            assert status in (403, 404), f"limited token got {status}"
            return
        # A fleet-wide list: allowed, but it must not show src-a's objects.
        assert status == 200
        assert "src-a" not in response.content.decode()
        return
    if not entitled:
        assert status == 403, f"{persona} got {status}"
    else:
        # Entitled callers may still meet a state error (409, or 403 approval_not_allowed),
        # but never a permission refusal.
        refused = status in (401, 403) and body_json["error"]["code"] in (
            "forbidden",
            "unauthenticated",
        )
        assert not refused, f"{persona} refused: {response.content!r}"
