"""The gate API from Redis: the copy follows every gate change at commit and matches the
database's serialisation; polls make one indexed query once cached (the check that the copy is
the revision the database has committed); a missing copy falls back to the
database and is primed; cached token grants stay exactly as strict as the database."""

import threading
import time

import pytest
from django.db import OperationalError, connection, transaction
from django.test import Client

from controlplane import redis_client
from controlplane.accounts import tokens
from controlplane.accounts.models import ApiToken
from controlplane.audit.recorder import Actor
from controlplane.intake.api.gates import render_gate
from controlplane.refresh import gate_cache, gates, ledger
from controlplane.refresh.models import Gate, GateState
from controlplane.refresh.policy_lag import with_lag
from tests.api.conftest import U64, bearer

GATE = "/api/v1/gates/src-a/rl-a"
SYSTEM = Actor.system("test")


def _db_payload(gate: Gate) -> dict:
    return with_lag(gates.serialize_gate(Gate.objects.select_related("source").get(pk=gate.pk)))


def _assert_copy_matches_database(client: Client, secret: str, gate: Gate, queries) -> dict:
    """Redis holds exactly the database's serialisation, and the API serves it with one query
    (the revision check)."""
    expected = _db_payload(gate)
    cached = gate_cache.read("src-a", "rl-a")
    assert cached is not None
    assert cached.payload() == expected
    assert cached.revision == expected["revision"] and cached.source_id == gate.source_id
    with queries(1):
        response = client.get(GATE, **bearer(secret))
    assert response.status_code == 200
    assert response.content == render_gate(expected)
    return response.json()


def test_the_copy_follows_every_kind_of_gate_change(
    fleet, viewer, token_factory, django_capture_on_commit_callbacks, django_assert_num_queries
):
    secret = token_factory(viewer, label="poller")
    client = Client()
    client.get(GATE, **bearer(secret))  # caches the grant (and primes the gate)
    gate, refresh = fleet["gate"], fleet["refresh"]

    with django_capture_on_commit_callbacks(execute=True):
        gates.open_gates_verified(refresh, actor=SYSTEM, verified={"rl-a": [U64]})
    body = _assert_copy_matches_database(client, secret, gate, django_assert_num_queries)
    assert body["state"] == "open" and body["verified_instances"] == [U64]
    assert body["verified_version"] == "v2"

    with django_capture_on_commit_callbacks(execute=True):
        gates.close_gates(refresh, actor=SYSTEM, reason="updating to v3")
    body = _assert_copy_matches_database(client, secret, gate, django_assert_num_queries)
    assert body["state"] == "closed" and body["reason"] == "updating to v3"
    assert body["active_refresh_id"] == refresh.pk

    with django_capture_on_commit_callbacks(execute=True):
        gates.force_open([gate], actor=SYSTEM, refresh=refresh, reason="ops decided")
    body = _assert_copy_matches_database(client, secret, gate, django_assert_num_queries)
    assert body["state"] == "open_forced" and body["forced"]["reason"] == "ops decided"

    # The verified set shrinks (a worker left): a new revision.
    with transaction.atomic(), django_capture_on_commit_callbacks(execute=True):
        locked = gates.locked_gate(gate.pk)
        assert locked is not None
        # The one admitted worker departed (the ledger's fact); a joiner is reported.
        departed = {(gate.namespace, i): ledger.departed() for i in locked.verified_instances}
        joined = {(gate.namespace, "424242"): {"version": "v0"}}
        gates.record_drift(locked, actor=SYSTEM, facts={**departed, **joined}, drift=[])
    body = _assert_copy_matches_database(client, secret, gate, django_assert_num_queries)
    assert body["verified_instances"] == [] and body["unverified_count"] == 1
    revision = body["revision"]

    # A discovery that confirms the set only moves `confirmed_at`: same revision, new copy.
    before = body["confirmed_at"]
    with transaction.atomic(), django_capture_on_commit_callbacks(execute=True):
        locked = gates.locked_gate(gate.pk)
        assert locked is not None
        gates.record_drift(locked, actor=SYSTEM, facts={}, drift=[])
    body = _assert_copy_matches_database(client, secret, gate, django_assert_num_queries)
    assert body["revision"] == revision and body["confirmed_at"] != before


def test_a_rolled_back_change_never_reaches_the_copy(
    fleet, viewer, token_factory, django_capture_on_commit_callbacks
):
    secret = token_factory(viewer, label="poller")
    Client().get(GATE, **bearer(secret))
    primed = gate_cache.read("src-a", "rl-a")
    assert primed is not None and primed.payload()["state"] == GateState.CLOSED

    class Boom(Exception):
        pass

    with (
        django_capture_on_commit_callbacks(execute=True),
        pytest.raises(Boom),
        transaction.atomic(),
    ):
        gates.force_open([fleet["gate"]], actor=SYSTEM, refresh=None, reason="never")
        raise Boom
    assert gate_cache.read("src-a", "rl-a") == primed
    assert Client().get(GATE, **bearer(secret)).json()["state"] == GateState.CLOSED


def test_a_missing_copy_is_read_from_the_database_and_primed(
    fleet, viewer, token_factory, django_assert_num_queries
):
    secret = token_factory(viewer, label="poller")
    client = Client()
    first = client.get(GATE, **bearer(secret))
    redis_client.sync_client().delete(gate_cache.gate_key("src-a", "rl-a"))

    from_db = client.get(GATE, **bearer(secret))
    assert from_db.status_code == 200 and from_db.json() == first.json()
    assert from_db["ETag"] == first["ETag"]
    assert gate_cache.read("src-a", "rl-a") is not None
    with django_assert_num_queries(1):  # the revision check
        again = client.get(GATE, **bearer(secret))
    assert again.content == from_db.content


def test_a_never_refreshed_namespace_is_served_unverified_and_primed(
    fleet, viewer, token_factory, django_assert_num_queries
):
    secret = token_factory(viewer, label="poller")
    Gate.objects.filter(pk=fleet["gate"].pk).delete()
    client = Client()
    first = client.get(GATE, **bearer(secret))
    assert first.status_code == 200
    # Never verified: not open (it used to answer `open`, admitting unverified weights).
    assert first.json()["state"] == "unverified" and first.json()["open"] is False
    assert first.json()["revision"] == 0
    # The revision check finds no gate row, then reads the source's policy mark.
    with django_assert_num_queries(2):
        unchanged = client.get(GATE, HTTP_IF_NONE_MATCH=first["ETag"], **bearer(secret))
    assert unchanged.status_code == 304


def test_a_reader_never_overwrites_a_newer_revision(fleet):
    gate = fleet["gate"]
    newer = _db_payload(gate)
    newer.update(revision=7, state="open", open=True)
    gate_cache.store([newer])
    older = _db_payload(gate)  # revision 1, as a reader that loaded it just before the write
    gate_cache.prime(older, gate.source_id)
    cached = gate_cache.read("src-a", "rl-a")
    assert cached is not None and cached.revision == 7 and cached.payload()["state"] == "open"
    # An equal revision differs at most in `confirmed_at` (moved without a revision): replaced.
    same = dict(newer, confirmed_at="2030-01-01T00:00:00+00:00")
    gate_cache.store([same])
    assert gate_cache.read("src-a", "rl-a").payload()["confirmed_at"] == same["confirmed_at"]


def _due_copy(source: str, namespace: str) -> None:
    """Make the gate's copy due for its rebuild (as it is REFRESH_AHEAD_SECONDS before lapsing)."""
    key = gate_cache.gate_key(source, namespace)
    revision, source_id, _, mark, body = redis_client.sync_client().get(key).split(b" ", 4)
    redis_client.sync_client().set(key, b" ".join([revision, source_id, b"0", mark, body]))


def test_a_copy_about_to_lapse_is_rebuilt_from_the_database_by_one_request(
    fleet, viewer, token_factory, django_assert_num_queries
):
    secret = token_factory(viewer, label="poller")
    client = Client()
    client.get(GATE, **bearer(secret))
    # What the database says now, and the copy does not (a source's words changed elsewhere).
    Gate.objects.filter(pk=fleet["gate"].pk).update(reason="held: disk full")
    _due_copy("src-a", "rl-a")
    rebuilt = client.get(GATE, **bearer(secret))
    assert rebuilt.json()["reason"] == "held: disk full"
    cached = gate_cache.read("src-a", "rl-a")
    assert cached is not None and not cached.due(time.time())
    with django_assert_num_queries(1):  # the revision check
        assert client.get(GATE, **bearer(secret)).json()["reason"] == "held: disk full"


def test_the_copy_carries_exactly_what_the_api_serves(fleet):
    """The copy's keys are GateOut's plus the internal source id and policy mark: nothing else
    could leak into a body rendered from Redis."""
    from controlplane.intake.api.gates import GateOut

    payload = _db_payload(fleet["gate"])
    assert set(payload) - set(GateOut.model_fields) == {"source_id", "policy_mark"}
    assert set(GateOut.model_fields) <= set(payload)


# -- tokens ------------------------------------------------------------------------------------


def test_a_revoked_token_stops_working_at_once(fleet, viewer, token_factory):
    secret = token_factory(viewer, label="poller")
    client = Client()
    assert client.get(GATE, **bearer(secret)).status_code == 200  # grant now cached
    tokens.revoke_token(ApiToken.objects.get(label="poller"), actor=SYSTEM)
    refused = client.get(GATE, **bearer(secret))
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "unauthenticated"


def test_a_request_racing_a_revoke_cannot_cache_the_old_grant(
    fleet, viewer, token_factory, monkeypatch
):
    """A request that read the token just before the revoke committed and caches its grant
    just after must not bring the token back."""
    secret = token_factory(viewer, label="poller")
    before_revoke = tokens.authenticate(secret)
    assert before_revoke is not None
    tokens.revoke_token(ApiToken.objects.get(label="poller"), actor=SYSTEM)
    monkeypatch.setattr(tokens, "authenticate", lambda s: before_revoke)
    assert tokens.grant_for(secret) is not None  # the racing request itself still passes
    monkeypatch.undo()
    assert tokens.grant_for(secret) is None
    assert Client().get(GATE, **bearer(secret)).status_code == 401


def test_a_token_limited_to_one_source_never_reads_another(
    fleet, viewer, token_factory, django_capture_on_commit_callbacks
):
    other = Gate.objects.create(source=fleet["b"], namespace="rl-b", state=GateState.OPEN)
    with django_capture_on_commit_callbacks(execute=True):
        gates.force_open([other], actor=SYSTEM, refresh=None, reason="b is fine")
    assert gate_cache.read("src-b", "rl-b") is not None  # B's copy is right there in Redis
    secret = token_factory(viewer, label="a-only", sources=[fleet["a"]])
    client = Client()
    assert client.get(GATE, **bearer(secret)).status_code == 200
    refused = client.get("/api/v1/gates/src-b/rl-b", **bearer(secret))
    assert refused.status_code == 404 and refused.json()["error"]["code"] == "not_found"
    unlimited = token_factory(viewer, label="all")
    assert client.get("/api/v1/gates/src-b/rl-b", **bearer(unlimited)).status_code == 200


def _rewrite_grant(secret: str, **changes) -> None:
    """Change the cached grant of `secret` in Redis (as a rebuild would after a change)."""
    key = tokens.grant_key(tokens.key_id_of(secret) or "")
    grant = tokens.Grant.decode(redis_client.sync_client().get(key))
    assert grant is not None
    redis_client.sync_client().set(key, tokens.Grant(**{**grant.__dict__, **changes}).encode())


def test_the_cached_grants_permissions_are_enforced(fleet, viewer, token_factory):
    secret = token_factory(viewer, label="poller")
    client = Client()
    assert client.get(GATE, **bearer(secret)).status_code == 200
    _rewrite_grant(secret, perms=frozenset())
    refused = client.get(GATE, **bearer(secret))
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"


def test_a_role_change_reaches_the_token_when_its_grant_is_rebuilt(fleet, viewer, token_factory):
    secret = token_factory(viewer, label="poller")
    client = Client()
    assert client.get(GATE, **bearer(secret)).status_code == 200
    viewer.groups.clear()
    # Within GRANT_SECONDS the grant lapses; dropping it stands for that wait.
    redis_client.sync_client().delete(tokens.grant_key(tokens.key_id_of(secret) or ""))
    assert client.get(GATE, **bearer(secret)).status_code == 403


def test_a_grant_about_to_lapse_is_rebuilt_from_the_database_by_one_request(
    fleet, viewer, token_factory, django_assert_num_queries
):
    secret = token_factory(viewer, label="poller")
    client = Client()
    assert client.get(GATE, **bearer(secret)).status_code == 200
    viewer.groups.clear()  # the cached grant still says viewer
    with django_assert_num_queries(1):  # the revision check
        assert client.get(GATE, **bearer(secret)).status_code == 200
    _rewrite_grant(secret, refresh_at=0.0)
    assert client.get(GATE, **bearer(secret)).status_code == 403  # rebuilt: no longer a viewer
    grant = tokens.Grant.decode(
        redis_client.sync_client().get(tokens.grant_key(tokens.key_id_of(secret) or ""))
    )
    assert grant is not None and not grant.due(time.time()) and not grant.perms


def test_a_rebuilt_grant_never_replaces_a_revoke(fleet, viewer, token_factory, monkeypatch):
    secret = token_factory(viewer, label="poller")
    assert Client().get(GATE, **bearer(secret)).status_code == 200
    before_revoke = tokens.authenticate(secret)
    _rewrite_grant(secret, refresh_at=0.0)
    tokens.revoke_token(ApiToken.objects.get(label="poller"), actor=SYSTEM)
    # A rebuild that read the token just before the revoke writes after the marker: refused.
    monkeypatch.setattr(tokens, "authenticate", lambda s: before_revoke)
    tokens._load_grant(secret, tokens.key_id_of(secret) or "", replace=True)
    monkeypatch.undo()
    assert Client().get(GATE, **bearer(secret)).status_code == 401


def test_an_expired_token_is_refused_from_its_cached_grant(fleet, viewer, token_factory):
    secret = token_factory(viewer, label="poller")
    assert Client().get(GATE, **bearer(secret)).status_code == 200
    _rewrite_grant(secret, expires_at=1.0)
    assert Client().get(GATE, **bearer(secret)).status_code == 401
    # A forged secret with the same key id is refused against the cached hash too.
    assert Client().get(GATE, **bearer(secret[:-4] + "AAAA")).status_code == 401


def test_a_transaction_copies_each_gate_once_at_its_commit(
    fleet, monkeypatch, django_capture_on_commit_callbacks
):
    """A gate change registers its copies twice (`_update`, then `_announce`) and a
    transaction may hold several: the commit reads and copies each gate once, in one store."""
    stored: list[list[str]] = []
    monkeypatch.setattr(
        gate_cache, "store", lambda payloads: stored.append([p["namespace"] for p in payloads])
    )
    gate = fleet["gate"]
    entry = {"instance_id": "424242", "key": "w", "kind": "joined", "state": "quarantined"}
    Gate.objects.filter(pk=gate.pk).update(drift=[entry])
    with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
        gates.set_drift_state(gate.pk, "424242", "admitting")
    assert stored == [[gate.namespace]]


def test_a_copy_registered_in_a_rolled_back_savepoint_never_loses_a_later_one(
    fleet, monkeypatch, django_capture_on_commit_callbacks
):
    """The first registration's callback goes with its savepoint; a gate changed after it in
    the same transaction is still copied at the commit."""
    stored: list[str] = []
    monkeypatch.setattr(
        gate_cache, "store", lambda payloads: stored.extend(p["namespace"] for p in payloads)
    )
    gate = fleet["gate"]
    other = Gate.objects.create(source=gate.source, namespace="rl-b", state=GateState.CLOSED)

    class Boom(Exception):
        pass

    with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
        with pytest.raises(Boom), transaction.atomic():
            gates._copy_on_commit([gate.pk])
            raise Boom
        gates._copy_on_commit([other.pk])
    assert "rl-b" in stored


def test_the_copies_of_one_sources_gates_read_its_policy_lag_once(
    fleet, monkeypatch, django_capture_on_commit_callbacks
):
    """A change of several namespaces (a refresh's close or reopen) computes their lag in one
    batch per source, and each copy carries it."""
    batches: list[list[str]] = []
    real = gate_cache.with_lags_of

    def counted(source, payloads, **kwargs):
        batches.append([p["namespace"] for p in payloads])
        return real(source, payloads, **kwargs)

    monkeypatch.setattr(gate_cache, "with_lags_of", counted)
    gate = fleet["gate"]
    other = Gate.objects.create(source=gate.source, namespace="rl-b", state=GateState.CLOSED)
    with django_capture_on_commit_callbacks(execute=True):
        gates.force_open([gate, other], actor=SYSTEM, refresh=None, reason="ops decided")
    assert [sorted(b) for b in batches] == [["rl-a", "rl-b"]]
    for namespace in ("rl-a", "rl-b"):
        copy = gate_cache.read("src-a", namespace)
        assert copy is not None and "policy_lag" in copy.payload()
        assert copy.payload()["state"] == GateState.OPEN_FORCED


def test_a_copy_the_database_refuses_after_commit_waits_for_the_next_and_the_push_still_goes(
    fleet, monkeypatch, django_capture_on_commit_callbacks
):
    """The copy runs after the commit: a read that fails there (a terminated backend) must not
    raise into the caller, whose unit did commit, nor cancel the push registered after it.
    The gate stays pending, and the next commit copies it."""
    pushed: list[list[str]] = []
    monkeypatch.setattr(
        gates,
        "publish_gate_changes",
        lambda payloads: pushed.append([p["namespace"] for p in payloads]),
    )
    gate = fleet["gate"]
    committed = threading.Event()
    refused: list[str] = []

    def refuse_the_copy_read(execute, sql, params, many, context):
        if committed.is_set() and 'FROM "refresh_gate"' in sql:  # every try of this commit
            refused.append(sql)
            raise OperationalError("terminating connection due to administrator command")
        return execute(sql, params, many, context)

    gate_cache.redis_client.sync_client().delete(gate_cache.gate_key("src-a", "rl-a"))
    with (
        connection.execute_wrapper(refuse_the_copy_read),
        django_capture_on_commit_callbacks(execute=True),
    ):
        with transaction.atomic():
            gates.force_open([gate], actor=SYSTEM, refresh=None, reason="ops decided")
        committed.set()  # the callbacks run as this block ends
    assert refused, "the copy's read was not refused"
    assert pushed == [["rl-a"]]  # the push went all the same
    assert gate_cache.read("src-a", "rl-a") is None  # not copied...
    assert gate.pk in gates._pending_copies()  # ...but still pending

    other = Gate.objects.create(source=gate.source, namespace="rl-b", state=GateState.CLOSED)
    with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
        gates._copy_on_commit([other.pk])
    copy = gate_cache.read("src-a", "rl-a")
    assert copy is not None and copy.payload() == _db_payload(gate)
    assert not gates._pending_copies()


def test_the_copies_of_a_source_deleted_before_the_commit_are_dropped_not_raised(
    fleet, monkeypatch, django_capture_on_commit_callbacks
):
    """A source deleted between a gate change and its copy: nothing is written for it (an old
    copy is deleted), the other sources' copies are, and nothing raises after the commit."""
    gate = fleet["gate"]
    payload = gates.serialize_gate(Gate.objects.select_related("source").get(pk=gate.pk))
    gone = {**payload, "source_id": 987654321, "source": "src-gone", "namespace": "rl-gone"}
    key = gate_cache.gate_key("src-gone", "rl-gone")
    gate_cache.redis_client.sync_client().set(key, b"1 987654321 0 0 {}")
    gate_cache.store([gone, payload])
    assert gate_cache.redis_client.sync_client().get(key) is None
    copy = gate_cache.read("src-a", "rl-a")
    assert copy is not None and copy.revision == payload["revision"]
