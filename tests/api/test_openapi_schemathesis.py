"""Schemathesis against the served OpenAPI schema, in-process over WSGI: no server errors and
no responses outside the schema, as an admin token (so every endpoint is reachable).

Driven through each operation's Hypothesis strategy inside one pytest-django test, which keeps
the database fixtures and the per-test token simple.
"""

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.api.conftest import bearer

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


def _operations():
    schema = schemathesis.openapi.from_wsgi("/api/v1/openapi.json", get_wsgi_application())
    for result in schema.get_all_operations():
        operation = result.ok()
        # Deleting the only sources would leave little to explore; covered by the matrix.
        if operation.method.upper() != "DELETE":
            yield operation


@pytest.fixture
def keep_test_connection():
    """The WSGI handler closes "old" connections at request end, which would close the test's
    transaction; Django's own test client disconnects the same signal handlers."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


def test_api_conforms_to_its_schema(
    transactional_db, fleet, admin_user, token_factory, keep_test_connection
):
    # transactional_db: each request autocommits as in production, so a handled database error
    # (NUL in text, say) cannot poison the requests after it.
    secret = token_factory(admin_user, label="schemathesis")
    headers = {"Authorization": bearer(secret)["HTTP_AUTHORIZATION"]}
    operations = list(_operations())
    assert len(operations) >= 20

    for operation in operations:

        @settings(
            max_examples=20, deadline=None, suppress_health_check=list(HealthCheck), database=None
        )
        @given(case=operation.as_strategy())
        def run(case):
            case.call_and_validate(headers=headers, checks=CHECKS)

        run()
