"""`postgres_only`: for tests of what only PostgreSQL has (a connection pool, backends to
terminate, row locks under concurrent writers, the statement counts of its queries). Without
`DATABASE_URL` the suite runs on the embedded SQLite runtime, where they are skipped with this
reason instead of failing; CI runs on PostgreSQL, where they run."""

import pytest
from django.conf import settings

postgres_only = pytest.mark.skipif(
    not settings.DATABASES["default"]["ENGINE"].endswith("postgresql"),
    reason="needs PostgreSQL (set DATABASE_URL); the embedded runtime is SQLite",
)
