"""The Redis broker transport, made to ride out a Redis restart (`CELERY_BROKER_TRANSPORT`).

When the worker loses its broker connection, Celery collects the connection (dropping the
transport's client) and reconnects with a new one. Work still bound to the old channel then
reaches kombu's Redis channel, which builds a client from the dropped one and raises
`AttributeError: 'NoneType' object has no attribute 'hostname'`: restoring the unacked
messages on close, or acking a task that finished during the outage once the loop runs again.
Neither is caught (kombu and Celery only expect connection errors there), so the worker logged
"Unrecoverable error" and exited after a Redis restart under load.

Here such a channel raises a connection error instead: the one kind the close and the ack
already log and survive. The message concerned is redelivered (it stays in Redis's unacked set
until the visibility timeout) or went with Redis; the database row it acts on is the truth and
a duplicate is harmless (leases, claims), see controlplane/jobs.py.
"""

from __future__ import annotations

from typing import Any

from kombu.transport import redis as kombu_redis
from redis.exceptions import ConnectionError as RedisConnectionError


class Channel(kombu_redis.Channel):
    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        if self.connection.client is None:
            raise RedisConnectionError("this broker channel's connection was closed")
        return super()._connparams(asynchronous=asynchronous)


class Transport(kombu_redis.Transport):
    Channel = Channel
