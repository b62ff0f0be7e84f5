"""Request bodies of the JSON API are parsed with the shared bounded parser: a body nested
100,000 levels deep, or carrying NaN, is a 400 with a reason, never a crash."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest
from ninja.parser import Parser

from controlplane.dynamo.jsonsafe import loads_bounded


class BoundedJSONParser(Parser):
    def parse_body(self, request: HttpRequest):
        # django-ninja turns any exception here into HttpError(400); errors.py finds our
        # UnsafeJSON as its cause and answers with its code and message.
        return loads_bounded(
            request.body,
            max_depth=settings.JSON_MAX_DEPTH,
            max_bytes=settings.DATA_UPLOAD_MAX_MEMORY_SIZE or 2_621_440,
        )
