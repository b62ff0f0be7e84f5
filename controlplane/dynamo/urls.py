"""The rules for an http(s) base URL, written once.

Sources (listener, frontend, static workers), a worker's advertised `system_url` and
`admin_base_url`, and notification destinations all take a base URL. What they share: a string,
not blank, that parses (including its port), with the http or https scheme and a host. What
really differs between them is a parameter: whether surrounding whitespace, user information, a
query string or a fragment is allowed.

The wording follows Dynamo's listener (`RL admin base URL must not include user information`,
contract §1.5), so a problem reads the same whichever side found it; `name` is the subject of
the sentence.
"""

from __future__ import annotations

from urllib.parse import urlsplit

ALLOWED_SCHEMES = frozenset({"http", "https"})


def url_problem(
    url: object,
    name: str,
    *,
    allow_padding: bool = False,
    allow_userinfo: bool = False,
    allow_query: bool = False,
    allow_fragment: bool = False,
) -> str | None:
    """Why `url` is not an acceptable http(s) base URL, as one sentence about `name`; or None.

    `allow_padding` accepts surrounding whitespace (the parser strips it, as Dynamo's does).
    A bare `?` or `#` at the end counts as a query string or fragment, since an empty one is
    still one to a URL parser like Dynamo's.
    """
    if not isinstance(url, str):
        return f"{name} must be a string"
    if not url.strip():
        return f"{name} must not be blank"
    if not allow_padding and url != url.strip():
        return f"{name} must not start or end with whitespace"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a non-numeric or out-of-range port
    except ValueError as exc:
        return f"invalid {name}: {exc}"
    if parts.scheme.lower() not in ALLOWED_SCHEMES or not parts.hostname:
        return f"{name} must use HTTP or HTTPS and include a host"
    if not allow_userinfo and "@" in parts.netloc:
        return f"{name} must not include user information"
    if not allow_query and (parts.query or url.rstrip().endswith("?")):
        return f"{name} must not include a query string"
    if not allow_fragment and (parts.fragment or "#" in url):
        return f"{name} must not include a fragment"
    return None
