"""Give every request a correlation id, taken from `X-Request-ID` when the caller sends one."""

import re

from controlplane.correlation import correlation

_ACCEPTABLE = re.compile(r"^[A-Za-z0-9._-]{8,64}$")


class CorrelationIdMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        offered = request.headers.get("X-Request-ID", "")
        with correlation(offered if _ACCEPTABLE.match(offered) else None) as correlation_id:
            request.correlation_id = correlation_id
            response = self.get_response(request)
        response["X-Request-ID"] = correlation_id
        return response
