"""Shapes shared by JSON columns of several apps: plain lists, and outside data kept verbatim.

A JSON column with keys has its `TypedDict` in the module that owns those keys; a column that
is a plain list names its element type with an alias here; a column that stores what somebody
else sent (a request or response body, a webhook payload, a weight version) says so with
`OpaqueJson`: its shape is whoever sent it, and we never read a key of it without checking.
`controlplane/jsonshapes.py` maps every column to its shape (docs/develop/conventions.md).
"""

from __future__ import annotations

from typing import Any, TypedDict

#: Outside data stored verbatim: a peer's request or response body, a trainer's payload, an
#: audit row's details (any JSON its action records, hashed into the chain as written). Its
#: shape is the sender's; readers check each key they use. The conformance test skips it.
type OpaqueJson = Any

#: A weight version as the trainer sent it: any JSON (a string or an integer in practice),
#: compared as given and never parsed (docs/concepts: "the version is the trainer's").
type WeightVersion = OpaqueJson


class Empty(TypedDict):
    """`{}`: a structured column before anything was recorded in it (a refused drill's
    policies; a refresh stored before its compatibility record existed)."""


#: Namespace names of a source, in the order given or sorted.
type Namespaces = list[str]
#: Worker keys (`namespace/component/endpoint/instance_id`, `fleet.Worker.key`).
type WorkerKeys = list[str]
#: Instance ids, as decimal strings (Dynamo's are 64-bit, beyond JSON's safe integers).
type InstanceIds = list[str]
#: Networks in CIDR form an outbound URL must fall in (`controlplane.requests` checks them).
type Networks = list[str]
#: Relative admin routes a worker serves or may be called on.
type Routes = list[str]
#: Why something cannot go ahead, one sentence each, in the order found.
type Blockers = list[str]
#: Primary keys of `refresh.JournalEntry` rows (the calls that made a ledger interval).
type JournalIds = list[int]
#: Names of events (notification kinds) a destination subscribes to; empty = every event.
type EventNames = list[str]
