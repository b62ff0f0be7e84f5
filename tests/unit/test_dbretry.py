"""What `dbretry` retries (connection-level failures, whole units outside a transaction) and
how it gives up (past the bound, naming the database)."""

from __future__ import annotations

import psycopg
import pytest
from django.db import IntegrityError, OperationalError, transaction

from controlplane import dbretry


@pytest.fixture(autouse=True)
def _no_waiting(monkeypatch):
    monkeypatch.setattr(dbretry.time, "sleep", lambda _seconds: None)


def failing(times: int, error: Exception):
    calls = []

    def work():
        calls.append(1)
        if len(calls) <= times:
            raise error
        return len(calls)

    return work, calls


def test_connection_failures_are_transient_wrapped_or_not():
    wrapped = OperationalError("terminating connection due to administrator command")
    wrapped.__cause__ = psycopg.errors.AdminShutdown("terminating connection")
    assert dbretry.is_transient(wrapped)
    assert dbretry.is_transient(psycopg.OperationalError("the connection is lost"))
    assert not dbretry.is_transient(IntegrityError("duplicate key"))
    assert not dbretry.is_transient(ValueError("bad input"))
    # Given up already: an outer retry must not start over.
    outage = dbretry.DatabaseOutage("testing", 30.0, 25.0, wrapped)
    outage.__cause__ = wrapped
    assert not dbretry.is_transient(outage)


def test_a_unit_is_run_again_until_it_succeeds():
    work, calls = failing(3, OperationalError("server closed the connection unexpectedly"))
    assert dbretry.retry(work, what="testing") == 4
    assert len(calls) == 4


def test_other_errors_are_not_retried():
    work, calls = failing(1, IntegrityError("duplicate key"))
    with pytest.raises(IntegrityError):
        dbretry.retry(work, what="testing")
    assert len(calls) == 1


def test_past_the_bound_it_gives_up_naming_the_database(monkeypatch):
    clock = iter(range(0, 1000, 10))
    monkeypatch.setattr(dbretry.time, "monotonic", lambda: float(next(clock)))
    work, calls = failing(1000, OperationalError("connection refused"))
    with pytest.raises(dbretry.DatabaseOutage) as raised:
        dbretry.retry(work, what="writing the update journal", outage=dbretry.Outage(25.0))
    assert len(calls) == 4  # failures at 0, 10, 20 s; the one at 30 s is past 25 s
    assert str(raised.value) == (
        "database unreachable for 30.0 s (over REFRESH_DB_OUTAGE_SECONDS=25) while writing "
        "the update journal: OperationalError: connection refused"
    )


@pytest.mark.django_db
def test_nothing_is_retried_inside_an_outer_transaction():
    # The outer transaction died with the connection: only the outer unit can run again.
    work, calls = failing(1, OperationalError("server closed the connection unexpectedly"))
    with pytest.raises(OperationalError), transaction.atomic():
        dbretry.retry(work, what="testing")
    assert len(calls) == 1
