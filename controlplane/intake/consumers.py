"""`ws/gates/`: a push stream of gate changes for rollout frameworks.

Auth on connect: a bearer token in the `Authorization` header, or the browser session. On
connect the current state of every visible gate is sent first, since the Redis channel layer
may drop messages and a reconnecting client must resync from the database.
Optional `?source=<name>` narrows the stream to one source.
"""

from __future__ import annotations

import json
from collections.abc import Hashable
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async

from controlplane.accounts import tokens
from controlplane.accounts.roles import Perm
from controlplane.fleet.models import Source
from controlplane.realtime import LiveStream
from controlplane.refresh.gates import serialize_gate
from controlplane.refresh.live import GATES_GROUP
from controlplane.refresh.models import Gate

#: Close code for a refused socket: no acceptable bearer token or session (HTTP 401).
UNAUTHORIZED = 4401


def _principal(scope) -> tuple[Any, set[int] | None] | None:
    """(user, allowed source ids or None), or None when nobody acceptable is connecting."""
    headers = dict(scope.get("headers") or [])
    raw = headers.get(b"authorization", b"").decode("latin-1")
    if raw:
        kind, _, secret = raw.partition(" ")
        token = tokens.authenticate(secret.strip()) if kind.lower() == "bearer" else None
        if token is None:
            return None
        user, limit = token.user, tokens.allowed_source_ids(token)
    else:
        user, limit = scope.get("user"), None
        if user is None or not user.is_authenticated:
            return None
    if not user.has_perm(Perm.VIEW):
        return None
    return user, limit


class GateStreamConsumer(LiveStream):
    groups_to_join = (GATES_GROUP,)
    refused_code = UNAUTHORIZED
    # `render` is a filter and a json.dumps: no database, and equal for equal filters, so the
    # fan-out renders it once per event for every stream with the same token scope and source.
    shared_render = True
    render_uses_orm = False

    async def authorize(self) -> bool:
        principal = await database_sync_to_async(_principal)(self.scope)
        if principal is None:
            return False
        _, self.limit = principal
        return True

    async def prepare(self) -> bool:
        query = parse_qs(self.scope.get("query_string", b"").decode())
        self.source_name = (query.get("source") or [""])[0]
        self.allowed_names = None
        if self.limit is not None:
            self.allowed_names = await database_sync_to_async(self._source_names)()
        return True

    def _source_names(self) -> set[str]:
        return set(Source.objects.filter(pk__in=self.limit).values_list("name", flat=True))

    def resync(self) -> list[str]:
        gates = Gate.objects.select_related("source").order_by("source__name", "namespace")
        if self.limit is not None:
            gates = gates.filter(source_id__in=self.limit)
        if self.source_name:
            gates = gates.filter(source__name=self.source_name)
        snapshot = [serialize_gate(g) for g in gates]
        return [json.dumps({"event": "gates.snapshot", "gates": snapshot})]

    def render_share_key(self) -> Hashable:
        names = None if self.allowed_names is None else frozenset(self.allowed_names)
        return (names, self.source_name)

    def render(self, event: str, payload: dict[str, Any]) -> list[str]:
        source = payload.get("source")
        if self.allowed_names is not None and source not in self.allowed_names:
            return []
        if self.source_name and source != self.source_name:
            return []
        return [json.dumps({"event": event, "gate": payload})]
