"""`SimFleetControl`: the synchronous HTTP client for a fleet's `/_sim/` control API.

Same methods and return shapes as `FleetHandle`, for code in another process (a Celery worker,
a browser test, the demo runner) that only knows the control URL.
"""

from __future__ import annotations

from typing import Any

import httpx

from controlplane.simfleet.config import WorkerSpec
from controlplane.simfleet.faults import Fault


class SimFleetError(RuntimeError):
    """The control API refused a request; the message is its `error` text."""


class SimFleetControl:
    """`SimFleetControl("http://127.0.0.1:18002/_sim")`."""

    def __init__(self, control_url: str, *, timeout: float = 10.0) -> None:
        self.control_url = control_url.rstrip("/")
        self._http = httpx.Client(
            base_url=self.control_url, timeout=timeout, follow_redirects=False
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> SimFleetControl:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, body: Any = None) -> Any:
        response = self._http.request(method, path, json=body)
        data = response.json()
        if response.status_code >= 400:
            raise SimFleetError(data.get("error", response.text))
        return data

    def fleet(self) -> dict[str, Any]:
        return self._request("GET", "/fleet")

    def add_worker(self, spec: WorkerSpec | dict[str, Any]) -> str:
        body = spec.to_dict() if isinstance(spec, WorkerSpec) else spec
        return self._request("POST", "/workers", body)["key"]

    def remove_worker(self, key: str | int) -> None:
        self._request("DELETE", f"/workers/{key}")

    def inject(self, key: str | int, route: str, fault: Fault | dict[str, Any]) -> None:
        payload = fault.to_dict() if isinstance(fault, Fault) else fault
        self._request("POST", f"/workers/{key}/faults", {"route": route, "fault": payload})

    def clear_faults(self, key: str | int | None = None) -> None:
        self._request("DELETE", "/faults" if key is None else f"/workers/{key}/faults")

    def set_version(self, key: str | int, version: Any) -> None:
        self._request("PUT", f"/workers/{key}/version", {"version": version})

    def state(self, key: str | int) -> dict[str, Any]:
        return self._request("GET", f"/workers/{key}")

    def workers(self) -> list[dict[str, Any]]:
        return self._request("GET", "/workers")["workers"]

    def events(self) -> list[dict[str, Any]]:
        return self._request("GET", "/events")["events"]

    def set_churn(self, interval: float | None) -> None:
        self._request("POST", "/churn", {"interval": interval})
