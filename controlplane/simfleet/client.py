"""`SimFleetControl`: the synchronous HTTP client for a fleet's `/_sim/` control API.

Same methods and return shapes as `FleetHandle`, for code in another process (a Celery worker,
a browser test, the demo runner) that only knows the control URL.
"""

from __future__ import annotations

import http.client
import json
from typing import Any
from urllib.parse import quote, urlsplit

from controlplane.simfleet.config import WorkerSpec
from controlplane.simfleet.faults import Fault


class SimFleetError(RuntimeError):
    """The control API refused a request; the message is its `error` text."""


class SimFleetControl:
    """`SimFleetControl("http://127.0.0.1:18002/_sim")`.

    Built on the standard library's `http.client`: the simulator depends on no part of the
    control plane (it is what the Dynamo client is tested against), and a few local control
    calls need no connection pool. One connection per request; redirects are never followed
    and no proxy is used (the control API is always on this host).
    """

    def __init__(self, control_url: str, *, timeout: float = 10.0) -> None:
        self.control_url = control_url.rstrip("/")
        parts = urlsplit(self.control_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"control URL must be http://host:port/..., got {control_url!r}")
        self._host = parts.hostname
        self._port = parts.port or 80
        self._prefix = parts.path
        self._timeout = timeout

    def close(self) -> None:
        """Nothing stays open between calls; kept so callers can use `with`."""

    def __enter__(self) -> SimFleetControl:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, body: Any = None) -> Any:
        payload = None if body is None else json.dumps(body).encode()
        headers = {"accept": "application/json"}
        if payload is not None:
            headers["content-type"] = "application/json"
        conn = http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)
        try:
            conn.request(method, self._prefix + path, body=payload, headers=headers)
            response = conn.getresponse()
            raw = response.read()
        finally:
            conn.close()
        text = raw.decode("utf-8", "replace")
        data = json.loads(raw)
        if response.status >= 400:
            raise SimFleetError(data.get("error", text) if isinstance(data, dict) else text)
        return data

    def fleet(self) -> dict[str, Any]:
        fleet: dict[str, Any] = self._request("GET", "/fleet")
        return fleet

    def add_worker(self, spec: WorkerSpec | dict[str, Any]) -> str:
        body = spec.to_dict() if isinstance(spec, WorkerSpec) else spec
        return str(self._request("POST", "/workers", body)["key"])

    def remove_worker(self, key: str | int) -> None:
        self._request("DELETE", f"/workers/{_segment(key)}")

    def inject(self, key: str | int, route: str, fault: Fault | dict[str, Any]) -> None:
        payload = fault.to_dict() if isinstance(fault, Fault) else fault
        self._request(
            "POST", f"/workers/{_segment(key)}/faults", {"route": route, "fault": payload}
        )

    def clear_faults(self, key: str | int | None = None) -> None:
        self._request("DELETE", "/faults" if key is None else f"/workers/{_segment(key)}/faults")

    def set_version(self, key: str | int, version: Any) -> None:
        self._request("PUT", f"/workers/{_segment(key)}/version", {"version": version})

    def set_world_size(self, key: str | int, world_size: int | None) -> None:
        self._request("PUT", f"/workers/{_segment(key)}/world_size", {"world_size": world_size})

    def set_latency(self, key: str | int, latency: dict[str, Any] | None) -> None:
        path = f"/workers/{_segment(key)}/latency"
        if latency is None:
            self._request("DELETE", path)
        else:
            self._request("PUT", path, latency)

    def lineage(self) -> dict[str, Any] | None:
        lineage: dict[str, Any] | None = self._request("GET", "/lineage")["lineage"]
        return lineage

    def set_lineage(self, lineage: dict[str, Any] | None) -> None:
        if lineage is None:
            self._request("DELETE", "/lineage")
        else:
            self._request("PUT", "/lineage", lineage)

    def set_broken(self, version: Any, broken: str | dict[str, Any] | None) -> None:
        """Mark `version` a broken checkpoint (`"drift"`, `{"kind": "marginal"}`, ...), or
        healthy again with None."""
        path = f"/lineage/broken/{_segment(version)}"
        if broken is None:
            self._request("DELETE", path)
        else:
            self._request("PUT", path, {"kind": broken} if isinstance(broken, str) else broken)

    def state(self, key: str | int) -> dict[str, Any]:
        state: dict[str, Any] = self._request("GET", f"/workers/{_segment(key)}")
        return state

    def workers(self) -> list[dict[str, Any]]:
        workers: list[dict[str, Any]] = self._request("GET", "/workers")["workers"]
        return workers

    def events(self) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = self._request("GET", "/events")["events"]
        return events

    def set_churn(self, interval: float | None) -> None:
        self._request("POST", "/churn", {"interval": interval})

    def groups(self) -> list[dict[str, Any]]:
        groups: list[dict[str, Any]] = self._request("GET", "/groups")["groups"]
        return groups

    def broadcast(self, version: Any, group_name: str | None = None) -> int:
        body = {"version": version, "group_name": group_name}
        return int(self._request("POST", "/groups/broadcast", body)["groups"])


def _segment(key: str | int) -> str:
    # Percent-encoded like any HTTP client would (http.client refuses raw spaces and controls).
    return quote(str(key), safe="/")
