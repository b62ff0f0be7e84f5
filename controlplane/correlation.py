"""The correlation id ties log lines and audit rows of one request or one policy refresh."""

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_correlation_id: ContextVar[str | None] = ContextVar("correlation_id", default=None)


def current_correlation_id() -> str | None:
    return _correlation_id.get()


def new_correlation_id() -> str:
    return uuid.uuid4().hex


@contextmanager
def correlation(correlation_id: str | None = None) -> Iterator[str]:
    """Run a block under a correlation id (a fresh one unless given)."""
    value = correlation_id or new_correlation_id()
    token = _correlation_id.set(value)
    try:
        yield value
    finally:
        _correlation_id.reset(token)
