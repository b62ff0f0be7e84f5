"""The one set of base URL rules, and what each caller may allow on top of them."""

import pytest

from controlplane.dynamo.urls import url_problem


@pytest.mark.parametrize(
    "url",
    ["http://10.0.0.5:8001", "https://dynamo.example/", "http://[::1]:8001/base", "HTTP://h"],
)
def test_a_plain_http_base_url_is_accepted(url):
    assert url_problem(url, "listener url") is None


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        (None, "listener url must be a string"),
        ("", "listener url must not be blank"),
        ("   ", "listener url must not be blank"),
        (" http://h", "listener url must not start or end with whitespace"),
        ("http://h:99999", "invalid listener url: Port out of range 0-65535"),
        ("ftp://h", "listener url must use HTTP or HTTPS and include a host"),
        ("http://", "listener url must use HTTP or HTTPS and include a host"),
        ("10.0.0.5:8001", "listener url must use HTTP or HTTPS and include a host"),
        ("http://u:p@h/", "listener url must not include user information"),
        ("http://h/?a=1", "listener url must not include a query string"),
        ("http://h/?", "listener url must not include a query string"),
        ("http://h/#top", "listener url must not include a fragment"),
        ("http://h/#", "listener url must not include a fragment"),
    ],
)
def test_strict_rules_name_the_problem(url, problem):
    assert url_problem(url, "listener url") == problem


@pytest.mark.parametrize(
    ("url", "allow"),
    [
        (" http://h ", {"allow_padding": True}),
        ("http://u@h/", {"allow_userinfo": True}),
        ("https://hooks.example/x?token=1", {"allow_query": True}),
        ("http://h/#part", {"allow_fragment": True}),
    ],
)
def test_each_allowance_lifts_only_its_own_rule(url, allow):
    assert url_problem(url, "URL") is not None
    assert url_problem(url, "URL", **allow) is None


def test_allowances_never_lift_the_scheme_and_host_rule():
    everything = dict(allow_padding=True, allow_userinfo=True, allow_query=True)
    assert url_problem("file:///etc/passwd", "URL", allow_fragment=True, **everything) == (
        "URL must use HTTP or HTTPS and include a host"
    )
