"""`ws/gates/`: a push stream of gate changes for rollout frameworks.

Auth on connect: a bearer token in the `Authorization` header, or the browser session. On
connect the current state of every visible gate is sent first, since the Redis channel layer
may drop messages and a reconnecting client must resync from the database.
Optional `?source=<name>` narrows the stream to one source.
"""

from __future__ import annotations

from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from controlplane.accounts import tokens
from controlplane.accounts.roles import Perm

GATES_GROUP = "gates"


@database_sync_to_async
def _principal(scope):
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


@database_sync_to_async
def _snapshot(limit, source_name):
    from controlplane.refresh.gates import serialize_gate
    from controlplane.refresh.models import Gate

    gates = Gate.objects.select_related("source").order_by("source__name", "namespace")
    if limit is not None:
        gates = gates.filter(source_id__in=limit)
    if source_name:
        gates = gates.filter(source__name=source_name)
    return [serialize_gate(g) for g in gates]


@database_sync_to_async
def _source_names(limit):
    from controlplane.fleet.models import Source

    return set(Source.objects.filter(pk__in=limit).values_list("name", flat=True))


class GateStreamConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self):
        principal = await _principal(self.scope)
        if principal is None:
            await self.close(code=4401)
            return
        _, limit = principal
        query = parse_qs(self.scope.get("query_string", b"").decode())
        self.source_name = (query.get("source") or [""])[0]
        self.allowed_names = None if limit is None else await _source_names(limit)
        await self.channel_layer.group_add(GATES_GROUP, self.channel_name)
        await self.accept()
        await self.send_json(
            {"event": "gates.snapshot", "gates": await _snapshot(limit, self.source_name)}
        )

    async def disconnect(self, code):
        await self.channel_layer.group_discard(GATES_GROUP, self.channel_name)

    async def stream_event(self, message):
        payload = message.get("payload") or {}
        source = payload.get("source")
        if self.allowed_names is not None and source not in self.allowed_names:
            return
        if self.source_name and source != self.source_name:
            return
        await self.send_json({"event": message.get("event"), "gate": payload})

    async def receive_json(self, content, **kwargs):
        """The stream is one-way; anything a client sends is ignored."""
