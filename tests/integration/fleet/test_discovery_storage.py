"""Hostile discovery payloads through a real refresh on PostgreSQL: every run is recorded,
nothing crashes, and nothing the database cannot hold reaches it.

Two kinds of listener serve them: the simulated fleet (hostile worker names, descriptors and
versions, as a misbehaving deployment would produce them) and, for bytes no Dynamo listener
would write (NaN, broken JSON, 100,000 `[`), a raw HTTP listener on loopback that answers
`/v1/rl/workers` with exactly the body under test and the worker admin routes with hostile
version and liveness replies. Either way the refresh goes through the whole path: outbound
policy, HTTP, parsing, probes, storage, diff, audit.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator

import pytest
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.dynamo import limits
from controlplane.fleet.discovery import run_discovery
from controlplane.fleet.models import (
    DiscoveryRun,
    DiscoveryTrigger,
    Source,
    Worker,
    WorkerEvent,
    WorkerState,
)
from controlplane.refresh.models import JournalEntry, PlannedWorker
from controlplane.simfleet import Fault, WorkerSpec
from tests.conftest import examples
from tests.unit.dynamo.test_discovery_hostile import (
    Pairs,
    hostile_body,
    storable,
    sweep_entries,
    to_json,
)

MANUAL = DiscoveryTrigger.MANUAL
#: Generated payloads stored through the real refresh path per CI run (each is one refresh on
#: PostgreSQL; HYPOTHESIS_PROFILE=deep: the soak count). Every hostile table entry in every
#: field also reaches PostgreSQL in every run, in the sweep's few large listings; that every
#: payload shape and body damage is drawn is checked where 3,000 payloads are parsed
#: (tests/unit/dynamo/test_discovery_hostile.py): 300 do not reach the rarest shapes every run.
STORED_PAYLOADS = examples(ci=300, deep=2_000)
#: Swept entries per listing: one refresh stores (or rejects) this many at once.
SWEEP_CHUNK = 60


# ---- the columns and the parser's limits agree -------------------------------------------------

#: Worker columns filled from a discovery entry, and the parser's limit for each.
WORKER_COLUMN_LIMITS = {
    "namespace": limits.NAME_MAX,
    "component": limits.NAME_MAX,
    "endpoint": limits.NAME_MAX,
    "instance_id": limits.INSTANCE_ID_MAX,
    "request_plane_url": limits.REQUEST_PLANE_URL_MAX,
    "system_url": limits.URL_MAX,
    "admin_base_url": limits.URL_MAX,
    "model": limits.MODEL_MAX,
}
#: Worker string columns we fill ourselves from fixed vocabularies, never from the payload.
WORKER_INTERNAL_COLUMNS = {"family", "state", "liveness"}


def test_every_stored_discovery_string_fits_its_column():
    for name, limit in WORKER_COLUMN_LIMITS.items():
        assert Worker._meta.get_field(name).max_length >= limit, name
    # A new varchar column on Worker must be added to one of the two lists above.
    varchar = {
        f.name
        for f in Worker._meta.concrete_fields
        if f.get_internal_type() == "CharField" and f.max_length
    }
    assert varchar == set(WORKER_COLUMN_LIMITS) | WORKER_INTERNAL_COLUMNS
    for model in (Source, DiscoveryRun):
        assert model._meta.get_field("reported_namespace").max_length >= limits.NAME_MAX
    _low, high = connection.ops.integer_field_range(
        Worker._meta.get_field("world_size").get_internal_type()
    )
    assert high is None or high >= limits.WORLD_SIZE_MAX
    # Where a discovered worker is copied by a policy refresh.
    key = 3 * limits.NAME_MAX + limits.INSTANCE_ID_MAX + 3
    assert PlannedWorker._meta.get_field("key").max_length >= key
    assert PlannedWorker._meta.get_field("namespace").max_length >= limits.NAME_MAX
    assert PlannedWorker._meta.get_field("system_url").max_length >= limits.URL_MAX
    assert PlannedWorker._meta.get_field("model").max_length >= limits.MODEL_MAX
    admin_url = limits.URL_MAX + len("/engine/") + limits.ROUTE_MAX
    assert JournalEntry._meta.get_field("url").max_length >= admin_url


# ---- a raw listener ---------------------------------------------------------------------------


class RawListener:
    """Serves `/v1/rl/workers` with `body` verbatim, and the vLLM admin routes a refresh probes
    with `version_reply` / `liveness_reply`, on a loopback port in a background thread."""

    def __init__(self) -> None:
        self.body: bytes = b'{"protocol_version":1,"namespace":"rl","workers":[]}'
        self.version_reply: bytes = b'{"status":"ok","version":"v1","version_declared":true}'
        self.liveness_reply: bytes = b'{"status":"ok","alive":true}'
        self.status = 200  # of the /v1/rl/workers answer
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    async def _handle(self, request):
        from aiohttp import web

        await request.read()
        body = {
            "/v1/rl/workers": self.body,
            "/w/engine/get_weight_version": self.version_reply,
            "/w/engine/liveness_probe": self.liveness_reply,
        }.get(request.path)
        if body is None:
            return web.Response(status=404, body=b"")
        status = self.status if request.path == "/v1/rl/workers" else 200
        return web.Response(status=status, body=body, content_type="application/json")

    async def _start(self):
        from aiohttp import web

        self._server = web.Server(self._handle)
        self._site = await self._loop.create_server(self._server, "127.0.0.1", 0)
        return self._site.sockets[0].getsockname()[1]

    def start(self) -> RawListener:
        self._thread.start()
        port = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        self.url = f"http://127.0.0.1:{port}"
        return self

    def stop(self) -> None:
        async def close():
            self._site.close()
            await self._site.wait_closed()
            await self._server.shutdown()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


@pytest.fixture
def raw_listener() -> Iterator[RawListener]:
    listener = RawListener().start()
    yield listener
    listener.stop()


@pytest.fixture
def raw_source(db, raw_listener, make_source):
    class Endpoints:  # make_source wants a fleet-like object
        listener_url = raw_listener.url
        frontend_url = ""

    return make_source(Endpoints, name="raw")


def _refresh(source) -> DiscoveryRun | None:
    """One refresh in a savepoint, so a refresh that crashes (as on a database that refused a
    value) is counted by the caller instead of aborting every later one."""
    with transaction.atomic():
        return run_discovery(source.pk, trigger=MANUAL)


def invalid_rows(source) -> list[str]:
    """Rows of this source our own model validation refuses (what PostgreSQL stored but the
    application could not trust), by primary key and reason."""
    bad = []
    for worker in Worker.objects.filter(source=source):
        try:
            worker.full_clean(validate_unique=False, validate_constraints=False)
        except ValidationError as exc:
            bad.append(f"worker {worker.pk}: {exc.messages[:2]}")
    for run in DiscoveryRun.objects.filter(source=source):
        if run.finished_at is None or (not run.ok and not run.error):
            bad.append(f"run {run.pk}: unfinished or failed without a reason")
        if not storable(run.error, 10**6) or len(run.rejected_entries) > 50:
            bad.append(f"run {run.pk}: error or rejected entries not as promised")
    return bad


# ---- the bulk property: generated payloads through the real refresh ---------------------------

VERSION_REPLIES = [
    b'{"status":"ok","version":"v1","version_declared":true}',
    b'{"status":"ok","version":null,"version_declared":false}',
    b'{"status":"ok","version":{"step":8},"version_declared":true}',
    b'{"status":"ok","version":"a\\u0000b","version_declared":true}',
    b'{"status":"ok","version":NaN,"version_declared":true}',
    b'{"status":"ok","version":[Infinity],"version_declared":true}',
    b'{"status":"ok","version":"\\ud800","version_declared":true}',
    b'{"status":"ok","version":"' + b"v" * (limits.WEIGHT_VERSION_MAX + 1) + b'",'
    b'"version_declared":true}',
    b'{"status":"ok","version":[' + b"1," * 500 + b'1],"version_declared":true}',
    b'{"status":"ok","version":' + b"[" * 5000 + b"]" * 5000 + b',"version_declared":true}',
    b'{"status":"error","message":"engine\\u0000dead"}',
]
LIVENESS_REPLIES = [
    b'{"status":"ok","alive":true}',
    b'{"status":"error","message":"\\u0000\\ud800"}',
    b'{"status":NaN}',
]


def test_generated_hostile_payloads_store_cleanly(raw_listener, raw_source, capsys):
    source = raw_source
    figures = {"payloads": 0, "crashes": 0, "refused": 0, "stored": 0, "rejected_entries": 0}
    crashes: list[str] = []

    @settings(
        max_examples=STORED_PAYLOADS,
        deadline=None,
        database=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.function_scoped_fixture,
        ],
    )
    @given(
        hostile_body(),
        st.sampled_from(range(len(VERSION_REPLIES))),
        st.sampled_from(range(len(LIVENESS_REPLIES))),
    )
    def store_one(body, version, liveness):
        if isinstance(body, str):
            body = body.encode("utf-8", "surrogatepass")
        # Workers that advertise an admin URL are probed here, with a hostile reply.
        admin = raw_listener.url.encode() + b"/w"
        raw_listener.body = body.replace(b"http://127.0.0.1:9090", admin)
        raw_listener.version_reply = VERSION_REPLIES[version]
        raw_listener.liveness_reply = LIVENESS_REPLIES[liveness]
        runs_before = DiscoveryRun.objects.filter(source=source).count()
        figures["payloads"] += 1
        try:
            run = _refresh(source)
        except Exception as exc:  # counting crashes is the point
            figures["crashes"] += 1
            crashes.append(f"{type(exc).__name__}: {str(exc)[:200]}")
            return
        assert run is not None
        # Exactly one run recorded per refresh, and the source's state follows it.
        assert DiscoveryRun.objects.filter(source=source).count() == runs_before + 1
        source.refresh_from_db()
        assert source.stale == (not run.ok) and source.stale_reason == run.error
        if run.ok:
            figures["stored"] += 1
            figures["rejected_entries"] += len(run.rejected_entries)
            assert "could not store" not in run.error
        else:
            figures["refused"] += 1
            assert run.error and not run.error.startswith("could not store")

    store_one()
    bad = invalid_rows(source)
    workers = Worker.objects.filter(source=source)
    probe_errors = workers.exclude(version_error="").count()
    with capsys.disabled():
        print(
            f"\n[hostile discovery stored] {figures['payloads']} payloads → "
            f"{figures['crashes']} crashes, {len(bad)} invalid rows, "
            f"{DiscoveryRun.objects.filter(source=source).count()} runs recorded "
            f"({figures['stored']} stored, {figures['refused']} refused with a reason); "
            f"{workers.count()} workers, {figures['rejected_entries']} rejected entries kept, "
            f"{probe_errors} workers with a version probe error, "
            f"{WorkerEvent.objects.filter(source=source).count()} events"
        )
    assert crashes == [], crashes[:5]
    assert bad == [], bad[:5]
    assert DiscoveryRun.objects.filter(source=source).count() == figures["payloads"]
    assert figures["stored"] > 0 and figures["refused"] > 0 and workers.exists()
    assert probe_errors > 0


def _distinct(index: int, field: str, entry):
    """A swept entry with an identity of its own (unless the identity is what is swept), so the
    listing's entries are not refused as repeats of one another."""
    if field == "instance_id":
        return entry
    if isinstance(entry, Pairs):
        items = tuple((k, 10_000 + index if k == "instance_id" else v) for k, v in entry.items)
        return Pairs(items)
    return {**entry, "instance_id": 10_000 + index}


def test_every_entry_leaf_in_every_field_stores_cleanly(raw_listener, raw_source):
    cases = [_distinct(i, field, entry) for i, (field, _v, entry) in enumerate(sweep_entries())]
    runs = stored = rejected = 0
    for start in range(0, len(cases), SWEEP_CHUNK):
        doc = {
            "protocol_version": 1,
            "namespace": "rl",
            "workers": cases[start : start + SWEEP_CHUNK],
        }
        raw_listener.body = to_json(doc, ascii_only=start % 2 == 0).encode("utf-8", "surrogatepass")
        run = _refresh(raw_source)  # a crash fails the test here
        runs += 1
        # Entry-level trouble rejects the entry, never the listing.
        assert run is not None and run.ok, run and run.error
        stored += run.workers_total
        rejected += len(run.rejected_entries)
    assert invalid_rows(raw_source) == []
    assert DiscoveryRun.objects.filter(source=raw_source).count() == runs
    assert stored > 0 and rejected > 0


# ---- targeted: each kind of trouble that crashed discovery before ------------------------------


def _payload(*entries, namespace="rl") -> bytes:
    return json.dumps(
        {"protocol_version": 1, "namespace": namespace, "workers": list(entries)},
        allow_nan=True,
    ).encode()


def _entry(component="backend", instance_id=7, **extra):
    entry = {
        "namespace": "rl-a",
        "component": component,
        "endpoint": "rl",
        "instance_id": instance_id,
        "transport": {"tcp": f"127.0.0.1:1/t/rl-a/{component}/rl"},
        "request_plane_url": f"dyn://rl-a.{component}.rl",
        "routes": [],
    }
    entry.update(extra)
    return entry


@pytest.mark.parametrize(
    "literal", ["NaN", "Infinity", "-Infinity", "1e400"], ids=["nan", "inf", "-inf", "1e400"]
)
def test_nan_or_infinity_anywhere_refuses_the_payload_and_records_the_run(
    raw_listener, raw_source, literal
):
    body = _payload(_entry(), _entry("other", 8, transport={"tcp": 0.5}))
    raw_listener.body = body.replace(b"0.5", literal.encode())

    run = run_discovery(raw_source.pk, trigger=MANUAL)

    raw_source.refresh_from_db()
    assert not run.ok
    assert "JSON does not allow" in run.error or "out of range" in run.error
    assert raw_source.stale and raw_source.stale_reason == run.error
    assert not Worker.objects.filter(source=raw_source).exists()  # nothing half-stored


def test_deep_nesting_at_the_listener_is_a_recorded_refusal(raw_listener, raw_source):
    raw_listener.body = b"[" * 100_000

    run = run_discovery(raw_source.pk, trigger=MANUAL)

    raw_source.refresh_from_db()
    assert not run.ok and DiscoveryRun.objects.filter(source=raw_source).count() == 1
    assert run.error == f"discovery payload is nested too deeply (over {limits.MAX_DEPTH} levels)"
    assert raw_source.stale and raw_source.stale_reason == run.error


def test_nul_and_over_long_strings_reject_only_their_entry(raw_listener, raw_source):
    raw_listener.body = _payload(
        _entry("good", 1),
        _entry("nul\x00", 2),
        _entry("c" * (limits.NAME_MAX + 1), 3),
        _entry("model", 4, model="m" * (limits.MODEL_MAX + 1)),
        _entry("url", 5, system_url="http://127.0.0.1:1/" + "u" * limits.URL_MAX),
        _entry("err", 6, error="boom\x00"),
        _entry("transport", 7, transport={"tcp": "\x00"}),
        # Control characters other than NUL are data: kept as they came.
        _entry("bidi\u202e\x1b\x85", 8, error="engine \x07 is dead"),
    )

    run = run_discovery(raw_source.pk, trigger=MANUAL)

    assert run.ok and run.workers_total == 2
    components = set(Worker.objects.filter(source=raw_source).values_list("component", flat=True))
    assert components == {"good", "bidi\u202e\x1b\x85"}
    bidi = Worker.objects.get(source=raw_source, component="bidi\u202e\x1b\x85")
    assert bidi.error == "engine \x07 is dead" and bidi.state == WorkerState.ERRORING
    reasons = {r["index"]: r["reason"] for r in run.rejected_entries}
    assert reasons == {
        1: "'component' contains a NUL character",
        2: f"'component' is {limits.NAME_MAX + 1} characters long, over the "
        f"{limits.NAME_MAX}-character limit",
        3: f"'model' is {limits.MODEL_MAX + 1} characters long, over the "
        f"{limits.MODEL_MAX}-character limit",
        4: f"'system_url' is {len('http://127.0.0.1:1/') + limits.URL_MAX} characters long, "
        f"over the {limits.URL_MAX}-character limit",
        5: "'error' contains a NUL character",
        6: "'transport' has a string that contains a NUL character",
    }
    # What was refused is kept for display, in a form the database holds (NUL escaped).
    nul_raw = next(r["raw"] for r in run.rejected_entries if r["index"] == 1)
    assert isinstance(nul_raw, str) and "nul\\u0000" in nul_raw


def test_over_long_namespace_refuses_the_payload(raw_listener, raw_source):
    raw_listener.body = _payload(_entry(), namespace="n" * (limits.NAME_MAX + 1))
    run = run_discovery(raw_source.pk, trigger=MANUAL)
    assert not run.ok and run.error.startswith("discovery payload 'namespace' is 201 characters")


def test_listener_error_message_with_nul_is_recorded(raw_listener, raw_source):
    # A non-200 answer's message is quoted in the run's reason, the source's stale reason, the
    # audit row and the notification: NUL and lone surrogates must not reach those columns.
    raw_listener.status = 503
    raw_listener.body = b'{"error":"unavailable","message":"etcd\\u0000down \\ud800"}'

    run = run_discovery(raw_source.pk, trigger=MANUAL)

    raw_source.refresh_from_db()
    assert not run.ok
    assert run.error == "listener answered HTTP 503: etcd\ufffddown \ufffd"
    assert raw_source.stale_reason == run.error


# ---- through the simulated fleet's real listener ----------------------------------------------


def test_hostile_worker_names_from_the_simulated_fleet(simfleet, make_source):
    source = make_source(simfleet)
    simfleet.add_worker(WorkerSpec(namespace="rl-a", component="nul\x00name"))
    simfleet.add_worker(WorkerSpec(namespace="rl-b", component="c" * (limits.NAME_MAX + 1)))
    simfleet.add_worker(WorkerSpec(namespace="rl-b", model="m" * (limits.MODEL_MAX + 1)))

    run = run_discovery(source.pk, trigger=MANUAL)

    assert run.ok and run.workers_total == 4  # the fixture's four healthy workers
    assert len(run.rejected_entries) == 3
    assert {r["reason"].split(" ")[0] for r in run.rejected_entries} == {
        "'component'",
        "'model'",
    }
    assert Worker.objects.filter(source=source, state=WorkerState.LIVE).count() == 4


def test_a_u32_world_size_is_stored(simfleet, make_source):
    # world_size is a u32 (contract §1.3); PostgreSQL's `integer` stops at 2^31-1.
    source = make_source(simfleet)
    victim = simfleet.workers()[0]["instance_id"]
    descriptor = {
        "routes": ["get_weight_version", "liveness_probe"],
        "system_url": simfleet.admin_url + "/nowhere",
        "world_size": limits.WORLD_SIZE_MAX,
    }
    simfleet.inject(victim, "probe", Fault(kind="body", body=descriptor))

    run = run_discovery(source.pk, trigger=MANUAL)

    assert run.ok
    assert Worker.objects.get(source=source, instance_id=str(victim)).world_size == 2**32 - 1


@pytest.mark.parametrize(
    ("version", "problem"),
    [
        ("v\x00", "weight version contains a NUL character"),
        ("v" * (limits.WEIGHT_VERSION_MAX + 1), "weight version is 201 characters long"),
        # NaN/Infinity are refused at the JSON boundary (dynamo/jsonsafe.py): the reply is
        # kept as text, which is no valid version reply.
        (float("nan"), "expected status 'ok' from get_weight_version, got a str body"),
        ([float("inf")], "expected status 'ok' from get_weight_version, got a str body"),
        (list(range(100)), "weight version is 291 characters as JSON, over the 200"),
        ({"\x00": 1}, "weight version has a key that contains a NUL character"),
    ],
    ids=["nul", "too-long", "nan", "infinity", "big-list", "nul-key"],
)
def test_hostile_weight_version_is_a_probe_error(simfleet, make_source, version, problem):
    source = make_source(simfleet)
    victim, other = (w["instance_id"] for w in simfleet.workers()[:2])
    simfleet.set_version(victim, version)
    simfleet.set_version(other, {"step": 8})  # any small JSON value is a version (contract §4)

    run = run_discovery(source.pk, trigger=MANUAL)

    assert run.ok
    worker = Worker.objects.get(source=source, instance_id=str(victim))
    assert worker.version_error.startswith(problem), worker.version_error
    assert worker.weight_version is None and worker.version_probed_at is None
    assert worker.state == WorkerState.LIVE  # the worker is listed and usable; its version not
    kept = Worker.objects.get(source=source, instance_id=str(other))
    assert kept.weight_version == {"step": 8} and kept.version_error == ""
