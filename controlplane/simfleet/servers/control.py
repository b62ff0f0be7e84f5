"""The `/_sim/` control API: membership, faults and state as JSON over HTTP.

Lets processes other than the one running the fleet (a Celery worker, a browser test, the
demo runner) drive it. `SimFleetControl` in `controlplane.simfleet.client` is its client.

    GET    /_sim/                            this table, as JSON (the demo prints this URL)
    GET    /_sim/fleet                       URLs, worker count, churn state
    GET    /_sim/events                      recent membership events
    GET    /_sim/workers                     worker summaries
    POST   /_sim/workers                     {spec} -> 201 {"key": ...}
    GET    /_sim/workers/<key>               full state incl. call log and faults
    DELETE /_sim/workers/<key>               the worker leaves
    POST   /_sim/workers/<key>/faults        {"route": ..., "fault": {...}}
    DELETE /_sim/workers/<key>/faults        clear this worker's faults
    DELETE /_sim/faults                      clear every fault
    PUT    /_sim/workers/<key>/version       {"version": ...}
    PUT    /_sim/workers/<key>/latency       {"ttft": {"median": s}, "per_token": {...}}
    DELETE /_sim/workers/<key>/latency       back to the fleet's default latency
    GET    /_sim/lineage                     the policy lineage served (null: none)
    PUT    /_sim/lineage                     {"seed": n, "amplitude": a, "broken": {...}}
    DELETE /_sim/lineage                     serve no lineage (unrelated outputs per version)
    PUT    /_sim/lineage/broken/<version>    {"kind": "drift" | "marginal" | "garbage" | ...}
    DELETE /_sim/lineage/broken/<version>    that version is healthy again
    POST   /_sim/churn                       {"interval": seconds | null}
    GET    /_sim/groups                      collective weight-update groups
    POST   /_sim/groups/broadcast            {"version": ..., "group_name": null} (the trainer)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from aiohttp import web

from controlplane.simfleet.faults import FAULT_KINDS
from controlplane.simfleet.fleet import SimFleet, UnknownWorker
from controlplane.simfleet.lineage import BROKEN_KINDS
from controlplane.simfleet.servers.common import json_response


class ControlApi:
    """Dispatches `/_sim/` requests onto the fleet."""

    def __init__(self, fleet: SimFleet, urls: Callable[[], dict[str, str]]) -> None:
        self.fleet = fleet
        self.urls = urls

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        parts = [p for p in request.path.split("/")[2:] if p]
        try:
            body = await self._body(request)
            return self._dispatch(request.method, parts, body)
        except UnknownWorker as exc:
            return json_response({"error": f"unknown worker {exc.args[0]!r}"}, 404)
        except (ValueError, TypeError, KeyError) as exc:
            return json_response({"error": str(exc)}, 400)

    @staticmethod
    async def _body(request: web.BaseRequest) -> Any:
        raw = await request.read()
        return json.loads(raw) if raw.strip() else {}

    def _dispatch(self, method: str, parts: list[str], body: Any) -> web.StreamResponse:
        fleet = self.fleet
        match method, parts:
            case "GET", []:
                return json_response(
                    {
                        "routes": routes_index(),
                        "fault_kinds": list(FAULT_KINDS),
                        "broken_checkpoint_kinds": list(BROKEN_KINDS),
                    }
                    | self.urls()
                )
            case "GET", ["fleet"]:
                return json_response(
                    self.urls() | {"workers": len(fleet.workers), "churning": fleet.churning}
                )
            case "GET", ["events"]:
                return json_response({"events": list(fleet.events)})
            case "GET", ["workers"]:
                return json_response({"workers": fleet.summaries()})
            case "POST", ["workers"]:
                return json_response({"key": fleet.add_worker(body)}, 201)
            case "GET", ["workers", key]:
                return json_response(fleet.state(key))
            case "DELETE", ["workers", key]:
                fleet.remove_worker(key)
                return json_response({"removed": key})
            case "POST", ["workers", key, "faults"]:
                fleet.inject(key, body["route"], body["fault"])
                return json_response({"ok": True})
            case "DELETE", ["workers", key, "faults"]:
                fleet.clear_faults(key)
                return json_response({"ok": True})
            case "DELETE", ["faults"]:
                fleet.clear_faults(None)
                return json_response({"ok": True})
            case "PUT", ["workers", key, "version"]:
                fleet.set_version(key, body["version"])
                return json_response({"ok": True})
            case "PUT", ["workers", key, "latency"]:
                fleet.set_latency(key, body)
                return json_response({"ok": True})
            case "DELETE", ["workers", key, "latency"]:
                fleet.set_latency(key, None)
                return json_response({"ok": True})
            case "DELETE", ["lineage"]:
                fleet.set_lineage(None)
                return json_response({"lineage": None})
            case "GET", ["lineage"]:
                return json_response({"lineage": fleet.lineage_view()})
            case "PUT", ["lineage"]:
                fleet.set_lineage(body)
                return json_response({"lineage": fleet.lineage_view()})
            case "PUT", ["lineage", "broken", version]:
                fleet.set_broken(version, body)
                return json_response({"lineage": fleet.lineage_view()})
            case "DELETE", ["lineage", "broken", version]:
                fleet.set_broken(version, None)
                return json_response({"lineage": fleet.lineage_view()})
            case "PUT", ["workers", key, "world_size"]:
                fleet.set_world_size(key, body["world_size"])
                return json_response({"ok": True})
            case "GET", ["groups"]:
                return json_response({"groups": fleet.collectives.views()})
            case "POST", ["groups", "broadcast"]:
                count = fleet.collectives.broadcast(body.get("version"), body.get("group_name"))
                return json_response({"groups": count})
            case "POST", ["churn"]:
                interval = body.get("interval")
                if interval:
                    fleet.start_churn(float(interval))
                else:
                    fleet.stop_churn()
                return json_response({"churning": fleet.churning})
        return json_response({"error": f"no control route {method} /_sim/{'/'.join(parts)}"}, 404)


def routes_index() -> list[dict[str, str]]:
    """The control routes this module's docstring lists: method, path and what it does."""
    rows = []
    for line in (__doc__ or "").splitlines():
        words = line.split(maxsplit=2)
        if len(words) == 3 and words[0] in ("GET", "POST", "PUT", "DELETE"):
            rows.append({"method": words[0], "path": words[1], "does": words[2].strip()})
    return rows
