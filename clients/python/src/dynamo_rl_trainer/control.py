"""`ControlPlane`: the trainer's calls to the control plane.

Signed webhooks (the endpoint's `whsec_` secrets) announce checkpoints and report on a
refresh; a bearer token reads the gate, the workers and deliveries. Every call returns a typed
result or raises a `ControlPlaneError` carrying the server's error code.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

import httpx

from dynamo_rl_trainer.admission import AdmissionView, GateView, LedgerView
from dynamo_rl_trainer.errors import (
    ApplyTimeout,
    CheckpointRefused,
    Conflict,
    ControlPlaneError,
    GateTimeout,
    NotFound,
)
from dynamo_rl_trainer.results import (
    AdmittedInstances,
    ApplyRequest,
    Delivery,
    Gate,
    GroupView,
    WebhookAnswer,
    WorkerIdentity,
)
from dynamo_rl_trainer.signing import Signer, new_webhook_id

API_VERSION = "v1"
API_PREFIX = f"/api/{API_VERSION}"
PROVENANCE_PATH = f"{API_PREFIX}/provenance"
#: Webhook sends are retried on a dropped connection or a 5xx, with the same webhook id: the
#: server answers a repeat from the stored delivery, so a retry never starts a second refresh.
WEBHOOK_TRIES = 3
WORKERS_PAGE = 200


class ControlPlane:
    """One trainer's view of one scope (a source and a namespace) of the control plane.

    `secrets` are the webhook endpoint's (two while rotating; see `Signer`); `token` is an API
    token with the viewer role or more, needed for the gate, workers and deliveries.
    """

    def __init__(
        self,
        base_url: str,
        *,
        source: str,
        namespace: str,
        endpoint: str | None = None,
        secrets: str | Sequence[str] | None = None,
        token: str | None = None,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.source = source
        self.namespace = namespace
        self.endpoint = endpoint
        self.signer = Signer(secrets) if secrets else None
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(
            base_url=base_url.rstrip("/"), headers=headers, timeout=timeout, transport=transport
        )
        self._gates: dict[str, Gate] = {}
        self._provenance_supported: bool | None = None

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> ControlPlane:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- signed webhooks ----------------------------------------------------------------------
    def send_event(
        self, event_type: str, data: dict[str, Any], *, webhook_id: str | None = None
    ) -> WebhookAnswer:
        """Sign and send one event to this trainer's webhook endpoint."""
        if self.signer is None or self.endpoint is None:
            raise ValueError("sending webhooks needs the endpoint name and its secrets")
        body = json.dumps({"type": event_type, "data": data}, separators=(",", ":")).encode()
        message_id = webhook_id or new_webhook_id()
        path = f"{API_PREFIX}/webhooks/trainer/{quote(self.endpoint, safe='')}"
        for attempt in range(1, WEBHOOK_TRIES + 1):
            headers = {
                "content-type": "application/json",
                **self.signer.headers(body, webhook_id=message_id),
            }
            try:
                response = self.http.post(path, content=body, headers=headers)
            except httpx.TransportError:
                if attempt == WEBHOOK_TRIES:
                    raise
                continue
            if response.status_code >= 500 and attempt < WEBHOOK_TRIES:
                continue
            if response.status_code >= 400:
                raise ControlPlaneError.from_response(response, webhook=True)
            return WebhookAnswer.from_json(response.status_code, response.json())
        raise AssertionError("unreachable")  # pragma: no cover

    def announce_checkpoint(
        self,
        weight_version: str | int,
        *,
        model_path: str | None = None,
        distributed: dict[str, Any] | None = None,
        external: bool | dict[str, Any] = False,
        step: int | None = None,
        metrics: dict[str, float] | None = None,
        checkpoint_digest: str | None = None,
        namespaces: list[str] | None = None,
        fingerprint: dict[str, Any] | None = None,
        strategy: dict[str, Any] | None = None,
        webhook_id: str | None = None,
    ) -> WebhookAnswer:
        """`checkpoint.ready`: a new policy to roll out. Give exactly one of `model_path` (disk),
        `distributed` (`{"group": ..., "update": ...}`) or `external` (True, or
        `{"apply_timeout_s": s}`: the trainer's framework applies the weights itself after
        `wait_for_ready_for_apply` and calls `report_applied`). Answered 202 at once; the
        refresh is planned in the background (`delivery()`, `wait_for_gate()`)."""
        external_body: dict[str, Any] | None = None
        if isinstance(external, dict):
            external_body = dict(external)
        elif external:
            external_body = {}
        given = [model_path, distributed, external_body]
        if sum(value is not None for value in given) != 1:
            raise ValueError("give exactly one of model_path, distributed or external")
        data: dict[str, Any] = {"weight_version": weight_version}
        optional = {
            "model_path": model_path,
            "distributed": distributed,
            "external": external_body,
            "step": step,
            "metrics": metrics,
            "checkpoint_digest": checkpoint_digest,
            "namespaces": namespaces,
            "fingerprint": fingerprint,
            "strategy": strategy,
        }
        data.update({k: v for k, v in optional.items() if v is not None})
        return self.send_event("checkpoint.ready", data, webhook_id=webhook_id)

    def report_broadcast_done(
        self,
        refresh_id: int,
        *,
        weight_version: str | int | None = None,
        attempt: int | None = None,
        webhook_id: str | None = None,
    ) -> WebhookAnswer:
        """`broadcast.done`: the trainer broadcast a distributed refresh's weights to the group
        announced in `refresh.group_ready`. 409 (`Conflict`) when nothing waits for it."""
        data: dict[str, Any] = {"refresh_id": refresh_id}
        if weight_version is not None:
            data["weight_version"] = weight_version
        if attempt is not None:
            data["attempt"] = attempt
        return self.send_event("broadcast.done", data, webhook_id=webhook_id)

    def report_applied(
        self,
        refresh_id: int,
        version: str | int,
        instance_ids: Sequence[int | str] | None = None,
        *,
        webhook_id: str | None = None,
    ) -> ApplyRequest:
        """`refresh.applied`: the trainer's framework applied `version` to the workers an
        external refresh paused (`wait_for_ready_for_apply`), to `instance_ids` or, when None,
        to all of them. Answers the refresh's apply view (who reported, who is missing); once
        every worker reported, the refresh declares the version, verifies and reopens. A report
        already recorded changes nothing. Refused with `Conflict` (its `code`:
        `weight_version_mismatch`, `instance_not_in_refresh`, `not_awaiting_apply`) or
        `NotFound` (`unknown_refresh`); a refusal changes nothing."""
        data: dict[str, Any] = {"refresh_id": refresh_id, "weight_version": version}
        if instance_ids is not None:
            data["instance_ids"] = [str(int(i)) for i in instance_ids]
        answer = self.send_event("refresh.applied", data, webhook_id=webhook_id)
        if answer.external is None:
            # A repeat of a stored delivery is answered with its stored body: read the view.
            return self.apply_request(refresh_id)
        return ApplyRequest.from_json(answer.external)

    def canary_verdict(
        self,
        refresh_id: int,
        *,
        weight_version: str | int,
        passed: bool,
        metrics: dict[str, Any] | None = None,
        reason: str = "",
        webhook_id: str | None = None,
    ) -> WebhookAnswer:
        """`canary.verdict`: the trainer's evaluation of a canary in `canary_review`."""
        data = {
            "refresh_id": refresh_id,
            "weight_version": weight_version,
            "passed": passed,
            "metrics": metrics or {},
            "reason": reason,
        }
        return self.send_event("canary.verdict", data, webhook_id=webhook_id)

    # -- reads (bearer token) -----------------------------------------------------------------
    def _get(self, path: str, **kwargs: Any) -> httpx.Response:
        response = self.http.get(path, **kwargs)
        if response.status_code >= 400:
            raise ControlPlaneError.from_response(response)
        return response

    def delivery(self, webhook_id: str) -> Delivery:
        """What became of a webhook (its state, outcome and refresh)."""
        path = f"{API_PREFIX}/webhooks/deliveries/{quote(webhook_id, safe='')}"
        return Delivery.from_json(self._get(path).json())

    def wait_for_delivery(
        self, webhook_id: str, timeout: float, *, poll_interval: float = 0.5
    ) -> Delivery:
        """Poll a delivery until it is terminal (its refresh started, or why not); raises
        `CheckpointRefused` for an outcome that will not start a refresh."""
        deadline = time.monotonic() + timeout
        while True:
            delivery = self.delivery(webhook_id)
            if delivery.refused:
                raise CheckpointRefused(delivery)
            if delivery.terminal or time.monotonic() >= deadline:
                return delivery
            time.sleep(poll_interval)

    def refresh_group(
        self, refresh_id: int, *, wait: float = 0, after: str | None = None
    ) -> GroupView:
        """A distributed refresh's group (`GET /refreshes/<id>/group`): with `wait`, a long
        poll that answers once the group's state is no longer `after` (at most 60 s)."""
        params: dict[str, Any] = {}
        if wait:
            params["wait"] = min(wait, 60)
            if after is not None:
                params["after"] = after
        path = f"{API_PREFIX}/refreshes/{refresh_id}/group"
        timeout = self.http.timeout.read or 30.0
        answer = self._get(path, params=params, timeout=max(timeout, float(wait) + 10))
        return GroupView.from_json(answer.json())

    def wait_for_group_ready(self, refresh_id: int, timeout: float) -> GroupView:
        """Long-poll the group until its members joined (`ready`): then broadcast the weights
        and `report_broadcast_done(refresh_id, attempt=group.attempt)`."""
        deadline = time.monotonic() + timeout
        group = self.refresh_group(refresh_id)
        while group.state != "ready" and not group.ended:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            group = self.refresh_group(refresh_id, wait=min(remaining, 30), after=group.state)
        if group.state != "ready":
            raise Conflict(
                409, "group_not_ready", f"group is {group.state or 'not formed'}: {group.reason}"
            )
        return group

    def apply_request(self, refresh_id: int) -> ApplyRequest:
        """An external refresh's wait for the trainer (`GET /refreshes/<id>/external`): the
        paused workers (instance ids, namespaces, admin URLs), the version and the deadline."""
        path = f"{API_PREFIX}/refreshes/{refresh_id}/external"
        return ApplyRequest.from_json(self._get(path).json())

    def wait_for_ready_for_apply(
        self, refresh_id: int, timeout: float, *, poll_interval: float = 0.5
    ) -> ApplyRequest:
        """Poll an external refresh until it has paused its workers and waits for the weights
        (`refresh.ready_for_apply`): apply them, then `report_applied`. `Conflict` when the
        refresh stopped first (held, ended; `code` `refresh_<state>`), `ApplyTimeout` after
        `timeout` seconds."""
        deadline = time.monotonic() + timeout
        last: ApplyRequest | None = None
        while True:
            last = self.apply_request(refresh_id)
            if last.awaiting:
                return last
            if last.ended:
                raise Conflict(
                    409,
                    f"refresh_{last.refresh_state}",
                    f"policy refresh #{refresh_id} is {last.refresh_state} before asking for "
                    f"the weights{': ' + last.reason if last.reason else ''}",
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ApplyTimeout(refresh_id, timeout, last)
            time.sleep(min(poll_interval, remaining))

    def gate(self, namespace: str | None = None) -> Gate:
        """The scope's gate. The previous answer's `ETag` goes out as `If-None-Match`, so an
        unchanged gate costs the server a 304 and no rendering."""
        ns = namespace or self.namespace
        known = self._gates.get(ns)
        headers = {"If-None-Match": known.etag} if known is not None and known.etag else {}
        path = f"{API_PREFIX}/gates/{quote(self.source, safe='')}/{quote(ns, safe='')}"
        response = self.http.get(path, headers=headers)
        if response.status_code == 304 and known is not None:
            return known
        if response.status_code >= 400:
            raise ControlPlaneError.from_response(response)
        gate = Gate.from_json(response.json(), etag=response.headers.get("ETag"))
        self._gates[ns] = gate
        return gate

    def wait_for_gate(
        self,
        version: str | int,
        timeout: float,
        *,
        namespace: str | None = None,
        poll_interval: float = 0.5,
        allow_forced: bool = False,
        checkpoint: WebhookAnswer | None = None,
    ) -> Gate:
        """Poll the gate (ETag reuse: 304 while nothing changed) until it is verified open at
        `version`; `GateTimeout` after `timeout` seconds. With `checkpoint` (the answer to its
        `announce_checkpoint`), a delivery that ends without a refresh (`plan_blocked`,
        `failed`, `superseded`) raises `CheckpointRefused` at once instead of waiting out the
        timeout. A gate forced open by a person counts only with `allow_forced`."""
        deadline = time.monotonic() + timeout
        last: Gate | None = None
        missing: NotFound | None = None
        settled = False
        while True:
            try:
                last = self.gate(namespace)
            except NotFound as exc:
                # No gate yet: the scope's first discovery or refresh has not happened. Keep
                # waiting; a wrong name shows in the timeout's message.
                missing = exc
            else:
                missing = None
                if last.admits(version, allow_forced=allow_forced):
                    return last
            if checkpoint is not None and not settled:
                delivery = self.delivery(checkpoint.webhook_id)
                if delivery.refused:
                    raise CheckpointRefused(delivery)
                settled = delivery.terminal
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise GateTimeout(version, timeout, last, missing=missing)
            time.sleep(min(poll_interval, remaining))

    def workers(self, namespace: str | None = None) -> list[dict[str, Any]]:
        """The source's live workers in the namespace, as the API lists them."""
        scope = {"source": self.source, "namespace": namespace or self.namespace, "state": "live"}
        found: list[dict[str, Any]] = []
        while True:
            params = {**scope, "limit": WORKERS_PAGE, "offset": len(found)}
            page = self._get(f"{API_PREFIX}/workers", params=params).json()
            found.extend(page["items"])
            if not page["items"] or len(found) >= page["count"]:
                return found

    def admitted_instances(self, namespace: str | None = None) -> AdmittedInstances:
        """The instances the gate admits now (empty unless it is open), with the model each
        registered: pin generations to these with `nvext.backend_instance_id`."""
        gate = self.gate(namespace)
        if not gate.open:
            return AdmittedInstances(gate=gate, instances=())
        known = {int(w["instance_id"]): w for w in self.workers(gate.namespace)}
        instances = tuple(
            WorkerIdentity(
                instance_id=iid,
                namespace=gate.namespace,
                model=str(known[iid].get("model") or "") if iid in known else "",
                weight_version=known[iid].get("weight_version") if iid in known else None,
            )
            for iid in gate.verified_instances
        )
        return AdmittedInstances(gate=gate, instances=instances)

    # -- provenance -----------------------------------------------------------------------------
    def provenance_supported(self) -> bool:
        """Whether this server answers `GET /api/v1/provenance?instance_id=&at=` (the serving
        ledger), read once from its OpenAPI schema."""
        if self._provenance_supported is None:
            schema = self._get(f"{API_PREFIX}/openapi.json").json()
            self._provenance_supported = PROVENANCE_PATH in (schema.get("paths") or {})
        return self._provenance_supported

    def provenance(self, instance_id: int, at: str) -> dict[str, Any]:
        """The serving ledger's record of an instance at a moment (ISO-8601 `at`)."""
        params = {"instance_id": str(instance_id), "at": at}
        answer: dict[str, Any] = self._get(PROVENANCE_PATH, params=params).json()
        return answer

    def admission_view(
        self, namespace: str | None = None, *, allow_forced: bool = False
    ) -> AdmissionView:
        """What the guard asks "was this instance admitted at this version then?": the serving
        ledger when the server has it, else the gate as read now."""
        if self.provenance_supported():
            ns = namespace or self.namespace
            identities = {
                int(w["instance_id"]): WorkerIdentity(
                    instance_id=int(w["instance_id"]),
                    namespace=ns,
                    model=str(w.get("model") or ""),
                    weight_version=w.get("weight_version"),
                )
                for w in self.workers(ns)
            }
            return LedgerView(self, identities)
        return GateView(self.admitted_instances(namespace), allow_forced=allow_forced)


__all__ = ["API_PREFIX", "API_VERSION", "ControlPlane", "NotFound"]
