"""The serving ledger, provenance, policy lag and canary analysis cost the same statements at
100 workers as at 2,000: none of them reads or writes per worker.

The module builds the same scenario at both sizes (`paths.scenario`: a fleet refreshed from one
policy to the next, its ledger written by the real gate step and reopen, published policies, a
canary refresh waiting for its analysis) and counts each path's statements with
`CaptureQueriesContext`; the counts must be equal. Both sizes have the same four namespaces, so
what is per namespace (a gate, its lag) is the same at both; it is not per worker.
"""

from __future__ import annotations

import json

import pytest
from django.db import transaction
from django.test import Client

from controlplane.accounts.roles import Role
from controlplane.accounts.services import create_user_with_role
from controlplane.intake.provenance.views import WORKER_ROWS
from controlplane.refresh.gate_lags import lags_by_gate, with_lags
from controlplane.refresh.gates import serialize_gate
from controlplane.refresh.models import Gate
from controlplane.refresh.policy_lag import lag_of, policy_mark, with_lag
from tests.integration.scale import paths
from tests.integration.scale.fleet import count
from tests.postgres import postgres_only

pytestmark = [pytest.mark.django_db, postgres_only]

SIZES = (100, 2000)


@pytest.fixture(scope="module")
def scenarios(django_db_setup, django_db_blocker):
    """Built once for the module (a 2,000-worker scenario takes seconds), inside a transaction
    that is rolled back after its last test; each test runs in a savepoint within it."""
    with django_db_blocker.unblock():
        outer = transaction.atomic()
        # As a test case's own wrapper is: the lock-order check looks at the code's blocks.
        outer._from_testcase = True  # type: ignore[attr-defined]
        outer.__enter__()
        try:
            viewer = create_user_with_role("scale-viewer", Role.VIEWER, "x" * 20, validate=False)
            client = Client()
            client.force_login(viewer)
            yield {n: paths.scenario(n, client) for n in SIZES}
        finally:
            transaction.set_rollback(True)
            outer.__exit__(None, None, None)


def statements(scenarios, names: list[str]) -> dict[str, dict[int, int]]:
    """Per path, per size: its statements (what it needs first runs before, uncounted). Each
    path runs once unmeasured first, so what a first request does once per process (a
    template compiled, a session read into a cache) is not counted at one size only."""
    out: dict[str, dict[int, int]] = {}
    for name in names:
        run, prepare = paths.PATHS[name]
        out[name] = {}
        for n, s in scenarios.items():
            if prepare is not None:
                prepare(s)
            run(s)
            out[name][n], _ = count(lambda s=s, run=run: run(s))
    return out


def assert_flat(found: dict[str, dict[int, int]]) -> None:
    grown = {name: by_size for name, by_size in found.items() if len(set(by_size.values())) > 1}
    assert not grown, f"statements grow with the fleet: {grown} (all: {found})"


def test_the_ledger_is_written_in_the_same_statements_at_any_fleet_size(scenarios):
    built = {
        name: {n: s.built[name] for n, s in scenarios.items()} for name in scenarios[SIZES[0]].built
    }
    assert set(built) >= {
        "ledger: refresh closes the gates",
        "ledger: refresh reopens, verified",
        "ledger: canary wave verified",
    }
    assert_flat(built)


def test_version_windows_and_served_at_read_the_ledger_in_fixed_statements(scenarios):
    assert_flat(statements(scenarios, [n for n in paths.PATHS if n.startswith("ledger: ")][1:]))


def test_provenance_answers_cost_the_same_at_any_fleet_size(scenarios):
    assert_flat(statements(scenarios, [n for n in paths.PATHS if n.startswith("provenance: ")]))


def test_policy_lag_costs_the_same_at_any_fleet_size(scenarios):
    assert_flat(statements(scenarios, [n for n in paths.PATHS if n.startswith("policy lag: ")]))


def test_canary_analysis_costs_the_same_at_any_fleet_size(scenarios):
    assert_flat(statements(scenarios, [n for n in paths.PATHS if n.startswith("canary: ")]))


def test_policy_lag_of_many_gates_costs_what_one_does(scenarios):
    """Lags are read per source, not per gate: a page of every gate of a source costs what one
    gate does, and each lag is the one `lag_of` gives for that gate alone."""
    s = scenarios[SIZES[-1]]
    gates = list(Gate.objects.filter(source=s.fleet.source).select_related("source"))
    assert len(gates) == len(s.fleet.namespaces) > 1
    one, _ = count(lambda: lags_by_gate(gates[:1]))
    every, lags = count(lambda: lags_by_gate(gates))
    assert every == one, (one, every)
    for gate in gates:
        alone = lag_of(gate.source, gate.namespace, serialize_gate(gate))
        assert alone is not None and lags[gate.pk] == alone


def test_gates_with_their_lag_are_built_alike_one_at_a_time_or_a_page_at_once(scenarios):
    """`with_lag` (one gate: its API, its stream, its Redis copy) and `with_lags` (the gates
    API's pages) build one payload: each gate of a page, of whichever source, in the page's
    order, is what `with_lag` gives for it alone, and the page costs what one gate does."""
    gates = list(
        Gate.objects.filter(source__in=[s.fleet.source for s in scenarios.values()])
        .select_related("source")
        .order_by("namespace", "source")  # the sources interleaved
    )
    assert len({g.source_id for g in gates[:2]}) == 2
    one, _ = count(lambda: with_lags(gates[:1]))
    every, page = count(lambda: with_lags(gates))
    # One read of every source's mark, then each source's lags (the two fleets alike).
    assert every == 2 * one - 1, (one, every)
    for gate, built in zip(gates, page, strict=True):
        alone = with_lag(serialize_gate(gate), gate.source)
        assert built == alone and built["namespace"] == gate.namespace
        assert built["policy_lag"] is not None
        assert built["policy_mark"] == policy_mark(gate.source_id) > 0


def test_a_versions_page_shows_a_bounded_worker_table_and_the_export_all(scenarios):
    """At fleet scale the provenance page shows at most `WORKER_ROWS` workers per refresh, the
    ones that did not verify first, and says how many it leaves to the JSON export."""
    s = scenarios[SIZES[-1]]
    page = paths.provenance_version_page(s).decode()
    assert page.count('class="worker-outcome verified"') == WORKER_ROWS
    assert f"{s.fleet.size - WORKER_ROWS} more workers not shown" in page
    export = json.loads(paths.provenance_version_api(s))
    [refresh] = export["refreshes"]
    assert len(refresh["workers"]) == s.fleet.size
    # The canary's version: its wave verified, the rest planned and not yet run.
    canary = s.client.get(f"/versions/v3-{s.fleet.source.name}/provenance/").content.decode()
    shown = canary.count('class="worker-outcome"') + canary.count("worker-outcome verified")
    assert shown == WORKER_ROWS
    assert 'class="worker-outcome verified"' not in canary  # the unverified fill the rows
