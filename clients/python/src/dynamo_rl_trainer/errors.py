"""Typed errors. Every refusal from the control plane carries its stable `code` (the server's
`{"error": {"code", "message", "details"}}` body); frontend refusals carry Dynamo's OpenAI-style
`{"message", "type", "code"}`."""

from __future__ import annotations

from typing import Any

import httpx


class TrainerClientError(Exception):
    """Base class of everything this library raises on purpose."""


class ControlPlaneError(TrainerClientError):
    """The control plane refused a call. `code` is the server's stable error code
    (`bad_signature`, `unknown_endpoint`, `conflict`, `not_found`, `throttled`, ...)."""

    def __init__(self, status: int, code: str, message: str, details: Any = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.details = details

    @classmethod
    def from_response(cls, response: httpx.Response, *, webhook: bool = False) -> ControlPlaneError:
        """The typed error for a refusal: by status (`Conflict` for 409, ...), and for a signed
        webhook also a `WebhookRefused`."""
        try:
            body = response.json()
        except ValueError:
            body = None
        error = body.get("error") if isinstance(body, dict) else None
        if isinstance(error, dict) and isinstance(error.get("code"), str):
            table = _WEBHOOK_BY_STATUS if webhook else _BY_STATUS
            kind = table.get(response.status_code, WebhookRefused if webhook else ControlPlaneError)
            return kind(
                response.status_code,
                error["code"],
                str(error.get("message", "")),
                error.get("details"),
            )
        text = response.text[:300]
        plain = WebhookRefused if webhook else ControlPlaneError
        return plain(response.status_code, f"http_{response.status_code}", text)


class WebhookRefused(ControlPlaneError):
    """A signed webhook was refused (400, 401, 404, 409, 413, 422)."""


class Unauthorized(ControlPlaneError):
    """401: the token or the signature was not accepted."""


class Forbidden(ControlPlaneError):
    """403: the token's role or sources do not allow this."""


class NotFound(ControlPlaneError):
    """404: no such source, namespace, refresh or delivery (or not visible to this token)."""


class Conflict(ControlPlaneError):
    """409: nothing waits for this report, or the version/attempt is not the refresh's."""


class Throttled(ControlPlaneError):
    """429: too many long polls; retry after `Retry-After`."""


_BY_STATUS: dict[int, type[ControlPlaneError]] = {
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    429: Throttled,
}


class WebhookUnauthorized(WebhookRefused, Unauthorized):
    """401 on a webhook: no signature matches the endpoint's secrets, or the timestamp is
    outside the window."""


class WebhookNotFound(WebhookRefused, NotFound):
    """404 on a webhook: no enabled endpoint by this name."""


class WebhookConflict(WebhookRefused, Conflict):
    """409 on a webhook: the id was used for another body, or nothing waits for the report."""


class WebhookForbidden(WebhookRefused, Forbidden):
    """403 on a webhook: a namespace or strategy this endpoint does not allow."""


_WEBHOOK_BY_STATUS: dict[int, type[ControlPlaneError]] = {
    401: WebhookUnauthorized,
    403: WebhookForbidden,
    404: WebhookNotFound,
    409: WebhookConflict,
}


class GateTimeout(TrainerClientError):
    """`wait_for_gate` ran out of time; `last` is the gate as last seen (None if never read)."""

    def __init__(
        self, version: Any, timeout: float, last: Any, *, missing: ControlPlaneError | None = None
    ) -> None:
        if missing is not None:
            state = f"no such gate: {missing.message}"
        elif last is None:
            state = "never read"
        else:
            state = f"{last.state} at {last.verified_version!r}"
        super().__init__(f"gate did not admit {version!r} within {timeout:g} s (last: {state})")
        self.version = version
        self.timeout = timeout
        self.last = last
        self.missing = missing


class ApplyTimeout(TrainerClientError):
    """`wait_for_ready_for_apply` ran out of time before the refresh paused its workers for the
    trainer; `last` is the refresh's apply view as last read."""

    def __init__(self, refresh_id: int, timeout: float, last: Any) -> None:
        state = "never read" if last is None else f"refresh {last.refresh_state}"
        super().__init__(
            f"policy refresh #{refresh_id} did not ask for the weights within {timeout:g} s "
            f"(last: {state})"
        )
        self.refresh_id = refresh_id
        self.timeout = timeout
        self.last = last


class CheckpointRefused(TrainerClientError):
    """The checkpoint's delivery ended without starting a refresh (`plan_blocked`, `failed`,
    `superseded`); `delivery` says why."""

    def __init__(self, delivery: Any) -> None:
        super().__init__(
            f"checkpoint {delivery.webhook_id} ended {delivery.outcome}: "
            f"{delivery.detail or delivery.last_error or ''}".rstrip(": ")
        )
        self.delivery = delivery


class GenerationError(TrainerClientError):
    """The frontend refused or failed a generation. `status` is the HTTP status (0 when no
    answer came), `code`/`kind` Dynamo's `code`/`type`. `retryable` says whether the same
    attempt may be sent again."""

    def __init__(
        self, status: int, message: str, *, kind: str = "", retryable: bool = False
    ) -> None:
        super().__init__(f"{status} {kind}: {message}" if status else message)
        self.status = status
        self.message = message
        self.kind = kind
        self.retryable = retryable


class DuplicateAttempt(TrainerClientError):
    """The same (rollout, attempt) was already sent to completion and answered: a second send
    could produce a second sample for one attempt."""
