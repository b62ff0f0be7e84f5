"""The one permission idiom for page views: `@requires(Perm.X)`.

Sign-in is enforced for every view by `LoginRequiredMiddleware`; this decorator checks the
permission server-side before the view runs and answers 403 otherwise. Object access helpers
in the views only fetch (or 404): the permission is always on the view, where a reader sees it.
(The JSON API has its own `intake.api.auth.require`, which answers in the API's error format.)
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any, cast

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse

from controlplane.accounts.roles import Perm


def requires[V: Callable[..., HttpResponse]](*perms: Perm) -> Callable[[V], V]:
    """The user needs one of `perms` (usually just one), or the view answers 403."""
    if not perms:
        raise TypeError("requires() needs at least one permission")

    def decorator(view: V) -> V:
        @wraps(view)
        def checked(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if not any(request.user.has_perm(perm) for perm in perms):
                raise PermissionDenied
            return view(request, *args, **kwargs)

        return cast(V, checked)

    return decorator
