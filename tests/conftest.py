"""Shared fixtures: named personas (viewer, operator, approver, admin) and a clean cache."""

import os

import pytest
from hypothesis import settings as hypothesis_settings

from controlplane.accounts.roles import Role
from controlplane.accounts.services import create_user_with_role
from controlplane.embedded.pytest_plugin import clear_run_cache

PASSWORD = "correct-horse-battery-staple"

# Generated examples: every CI run draws a fixed, bounded number per property, fresh each run
# (no example database: a failure prints the blob that reproduces it), with no per-example
# deadline (the machine is shared; timing is not what these properties check).
# HYPOTHESIS_PROFILE=deep runs the soak counts that `examples` names.
hypothesis_settings.register_profile("ci", deadline=None, database=None, print_blob=True)
hypothesis_settings.register_profile("deep", parent=hypothesis_settings.get_profile("ci"))
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def examples(ci: int, deep: int) -> int:
    """A heavy property's example count under the loaded profile: `ci` by default."""
    return deep if hypothesis_settings.get_current_profile_name() == "deep" else ci


@pytest.fixture(autouse=True)
def _clean_cache():
    """Throttle counters and cached gate state must not leak between tests. Only this run's
    keys go (never FLUSHDB): other test runs may share the Redis database."""
    clear_run_cache()
    yield


@pytest.fixture(autouse=True)
def _close_gate_revision_readers():
    """A test's event loop ends with it: its gate-revision reader connection goes too, so the
    test database never has sessions left over from loops that are gone."""
    yield
    from controlplane.intake.api.gate_revisions import close_readers

    close_readers(only_closed_loops=True)


def _persona(role: Role):
    return create_user_with_role(f"{role.value}-1", role, PASSWORD, validate=False)


@pytest.fixture
def viewer(db):
    return _persona(Role.VIEWER)


@pytest.fixture
def operator(db):
    return _persona(Role.OPERATOR)


@pytest.fixture
def approver(db):
    return _persona(Role.APPROVER)


@pytest.fixture
def admin_user(db):
    return _persona(Role.ADMIN)


def _client_for(client_class, user):
    client = client_class()
    client.force_login(user)
    return client


@pytest.fixture
def viewer_client(viewer):
    from django.test import Client

    return _client_for(Client, viewer)


@pytest.fixture
def operator_client(operator):
    from django.test import Client

    return _client_for(Client, operator)


@pytest.fixture
def approver_client(approver):
    from django.test import Client

    return _client_for(Client, approver)


@pytest.fixture
def admin_client(admin_user):
    from django.test import Client

    return _client_for(Client, admin_user)


pytest_plugins = [
    "tests.fixtures.simfleet",
    "tests.fixtures.celery_worker",
    "tests.fixtures.live_server",
    "tests.fixtures.channels",
    "tests.fixtures.fault_report",
]


#: Suites that run one at a time under pytest-xdist (`--dist loadgroup`), each on one worker:
#: real Dynamo processes and fault scenarios load the whole machine, and their timing bounds
#: assume nothing else of theirs runs beside them. Everything else spreads over the workers.
_SERIAL_SUITES = ("tests/interop/", "tests/fault/")


def _shares_a_module_fixture(item) -> bool:
    """Whether the test asks for a module-scoped fixture (a provider, a server of its own):
    built once per worker that runs any of the module's tests, so the module stays on one.
    Autouse module fixtures (a summary line) are not worth a worker of their own."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(
        defs[-1].scope == "module" and not getattr(defs[-1], "_autouse", False)
        for defs in info.name2fixturedefs.values()
        if defs
    )


def _keep_group_together(config, item, group: str) -> None:
    """Mark `item` for `--dist loadgroup`. pytest-xdist 3.8 groups by an `@group` suffix on the
    node id, which it writes to `item._nodeid`; pytest 9 reads node ids from `item._id`, so the
    suffix never reached the scheduler and no group was kept together. Written here, on the
    workers (where the scheduler's ids come from), the way pytest 9 reads it."""
    item.add_marker(pytest.mark.xdist_group(group))
    if not (hasattr(config, "workerinput") and config.getvalue("loadgroup")):
        return
    if "@" in item.nodeid.rpartition("]")[2]:
        return
    if hasattr(item, "_id"):  # pytest < 9 has no `_id`, and pytest-xdist's own suffix works
        from _pytest.nodeid import NodeId

        item._id = NodeId.parse(f"{item.nodeid}@{group}")


def pytest_collection_modifyitems(config, items):
    for item in items:
        for suite in _SERIAL_SUITES:
            if item.nodeid.startswith(suite):
                _keep_group_together(config, item, suite.strip("/").replace("/", "-"))
                break
        else:
            if _shares_a_module_fixture(item):
                _keep_group_together(config, item, item.nodeid.split("::")[0])
