"""One error body for every API failure: `{"error": {"code", "message", "details"}}`.

Every exception an endpoint can raise on bad input maps to a 4xx here; anything unmapped is a
bug, logged and answered with the same body shape and a 500.
"""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import ObjectDoesNotExist, PermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import DataError, IntegrityError
from django.db.models import ProtectedError
from django.http import Http404, HttpRequest, HttpResponse
from ninja import NinjaAPI, Schema
from ninja.errors import AuthenticationError, HttpError
from ninja.errors import ValidationError as NinjaValidationError

from controlplane.dynamo.jsonsafe import UnsafeJSON
from controlplane.refresh.errors import RefreshError

logger = logging.getLogger(__name__)

_CODES = {
    400: "bad_request",
    401: "unauthenticated",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "payload_too_large",
    422: "validation_error",
    429: "throttled",
}

# How the refresh app's typed errors surface: a state problem is a conflict, an approval by
# the wrong person is forbidden.
_REFRESH_STATUS = {
    "plan_blocked": 409,
    "refresh_conflict": 409,
    "invalid_transition": 409,
    "approval_not_allowed": 403,
}


class ErrorDetail(Schema):
    code: str
    message: str
    details: Any = None


class ErrorOut(Schema):
    error: ErrorDetail


#: Responses every authenticated operation may give, for the OpenAPI schema.
COMMON_ERRORS = {400: ErrorOut, 401: ErrorOut, 403: ErrorOut, 404: ErrorOut, 422: ErrorOut}


class ApiError(Exception):
    """Raise from an endpoint to answer with a specific status, code and details."""

    def __init__(self, status: int, code: str, message: str, details: Any = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details = details


def error_response(
    api: NinjaAPI, request: HttpRequest, status: int, code: str, message: str, details=None
) -> HttpResponse:
    body = {"error": {"code": code, "message": message, "details": details}}
    response = api.create_response(request, body, status=status)
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="api"'
    return response


def _django_validation_details(exc: DjangoValidationError) -> Any:
    if hasattr(exc, "error_dict"):
        return exc.message_dict
    return {"__all__": exc.messages}


def install(api: NinjaAPI) -> None:
    """Register the handlers on `api`, replacing django-ninja's `{"detail": ...}` bodies."""

    def on(exc_class, handler):
        api.add_exception_handler(exc_class, handler)

    def api_error(request, exc: ApiError):
        return error_response(api, request, exc.status, exc.code, exc.message, exc.details)

    def ninja_validation(request, exc: NinjaValidationError):
        return error_response(
            api, request, 422, "validation_error", "request did not validate", exc.errors
        )

    def http_error(request, exc: HttpError):
        cause = exc.__cause__
        if isinstance(cause, UnsafeJSON):
            status = 413 if cause.code == "payload_too_large" else 400
            return error_response(
                api, request, status, cause.code, f"request body: {cause.message}"
            )
        status = exc.status_code
        message = str(exc) or _CODES.get(status, "error")
        if isinstance(exc, AuthenticationError) and message == "Unauthorized":
            message = "authentication required: send 'Authorization: Bearer <token>' or sign in"
        return error_response(api, request, status, _CODES.get(status, "error"), message)

    def not_found(request, exc):
        message = str(exc) if isinstance(exc, Http404) and str(exc) else "not found"
        return error_response(api, request, 404, "not_found", message)

    def forbidden(request, exc: PermissionDenied):
        return error_response(api, request, 403, "forbidden", str(exc) or "you may not do this")

    def django_validation(request, exc: DjangoValidationError):
        return error_response(
            api,
            request,
            422,
            "validation_error",
            "; ".join(exc.messages)[:500],
            _django_validation_details(exc),
        )

    def data_error(request, exc):
        return error_response(api, request, 400, "invalid_input", "a value is not acceptable")

    def protected(request, exc: ProtectedError):
        return error_response(
            api,
            request,
            409,
            "conflict",
            "other records still refer to this one (e.g. its "
            "policy refreshes); it cannot be deleted",
        )

    def integrity(request, exc: IntegrityError):
        return error_response(api, request, 409, "conflict", "conflicts with existing data")

    def anything(request, exc: Exception):
        code = getattr(exc, "code", None)
        if code in _REFRESH_STATUS or isinstance(exc, RefreshError):
            details = {}
            active = getattr(exc, "active_refresh_id", None)
            if active is not None:
                details["active_refresh_id"] = active
            code = str(code or "refresh_conflict")
            status = _REFRESH_STATUS.get(code, 409)
            return error_response(api, request, status, code, str(exc), details or None)
        if isinstance(exc, ValueError) and "NUL" in str(exc):
            # PostgreSQL refuses NUL characters in text; that is bad input, not a bug.
            return error_response(api, request, 400, "invalid_input", "text must not contain NUL")
        logger.exception("unhandled API error on %s %s", request.method, request.path)
        return error_response(api, request, 500, "internal_error", "internal error")

    on(ApiError, api_error)
    on(NinjaValidationError, ninja_validation)
    on(HttpError, http_error)
    on(Http404, not_found)
    on(ObjectDoesNotExist, not_found)
    on(PermissionDenied, forbidden)
    on(DjangoValidationError, django_validation)
    on(DataError, data_error)
    on(ProtectedError, protected)
    on(IntegrityError, integrity)
    on(Exception, anything)
