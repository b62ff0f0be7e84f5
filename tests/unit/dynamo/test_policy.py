import ipaddress
from urllib.parse import urlsplit

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.dynamo.errors import OutboundPolicyError
from controlplane.dynamo.policy import OutboundPolicy


def fake_dns(table):
    def resolve(host):
        if host not in table:
            raise OSError(f"Name or service not known: {host}")
        return table[host]

    return resolve


PRIVATE = OutboundPolicy.from_cidrs(["10.0.0.0/8", "fd00::/8"])


@pytest.mark.parametrize(
    "url",
    [
        "http://10.1.2.3:9090",
        "https://10.255.0.1/engine/pause_generation",
        "http://[fd00::5]:8080/",
        "HTTP://10.0.0.1",
    ],
)
def test_allowed(url):
    assert PRIVATE.violation(url) is None
    PRIVATE.check(url)


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("http://169.254.169.254/latest/meta-data/", "169.254.169.254, outside"),
        ("http://[::ffff:169.254.169.254]/", "169.254.169.254, outside"),
        ("http://127.0.0.1:8001", "127.0.0.1, outside"),
        ("http://[::1]:8001", "::1, outside"),
        ("http://[fe80::1]:80", "outside"),
        ("http://user:pw@10.0.0.1/", "user information"),
        ("http://user@10.0.0.1/", "user information"),
        ("ftp://10.0.0.1/", "scheme 'ftp'"),
        ("file:///etc/passwd", "scheme 'file'"),
        ("gopher://10.0.0.1/", "scheme 'gopher'"),
        ("10.0.0.1:80", "scheme"),
        ("http:///nohost", "no host"),
        ("http://10.0.0.1:99999/", "invalid URL"),
    ],
)
def test_rejected(url, fragment):
    problem = PRIVATE.violation(url)
    assert problem is not None
    assert fragment in problem
    with pytest.raises(OutboundPolicyError) as info:
        PRIVATE.check(url)
    assert info.value.url == url
    assert fragment in info.value.reason


def test_empty_allowlist_allows_nothing():
    policy = OutboundPolicy.from_cidrs([])
    assert "empty allowlist" in policy.violation("http://10.0.0.1/")


def test_dns_name_resolving_to_localhost_is_rejected():
    policy = OutboundPolicy.from_cidrs(
        ["10.0.0.0/8"], resolver=fake_dns({"evil.example": ["127.0.0.1"]})
    )
    assert "resolves to 127.0.0.1" in policy.violation("http://evil.example:8000/")


def test_every_resolved_address_must_be_allowed():
    policy = OutboundPolicy.from_cidrs(
        ["10.0.0.0/8"], resolver=fake_dns({"mixed": ["10.0.0.2", "169.254.169.254"]})
    )
    assert "169.254.169.254" in policy.violation("http://mixed/")
    ok = OutboundPolicy.from_cidrs(
        ["10.0.0.0/8"], resolver=fake_dns({"w": ["10.0.0.2", "10.9.9.9"]})
    )
    assert ok.violation("http://w/") is None


def test_unresolvable_name():
    policy = OutboundPolicy.from_cidrs(["10.0.0.0/8"], resolver=fake_dns({}))
    assert "does not resolve" in policy.violation("http://nowhere.invalid/")


def test_real_resolver_localhost_outside_allowlist():
    # `localhost` resolves through the OS; whatever it yields is loopback, outside 10/8.
    assert "outside the allowed networks" in PRIVATE.violation("http://localhost:8000/")
    loop = OutboundPolicy.from_cidrs(["127.0.0.0/8", "::1/128"])
    assert loop.violation("http://localhost:8000/") is None


def test_ipv6_allowlist_does_not_admit_ipv4():
    v6 = OutboundPolicy.from_cidrs(["::/0"])
    assert v6.violation("http://10.0.0.1/") is not None
    assert v6.violation("http://[2001:db8::1]/") is None


@pytest.mark.parametrize("bad", ["10.0.0.1/8", "not-a-cidr", "", "10.0.0.0/33"])
def test_from_cidrs_rejects_bad_entries(bad):
    with pytest.raises(ValueError, match="CIDR"):
        OutboundPolicy.from_cidrs([bad])


def test_from_cidrs_parses_networks():
    policy = OutboundPolicy.from_cidrs([" 10.0.0.0/8 ", "127.0.0.1/32"])
    assert policy.allowed_networks == (
        ipaddress.ip_network("10.0.0.0/8"),
        ipaddress.ip_network("127.0.0.1/32"),
    )


async def test_aviolation_matches_violation():
    policy = OutboundPolicy.from_cidrs(["10.0.0.0/8"], resolver=fake_dns({"w": ["10.1.1.1"]}))
    assert await policy.aviolation("http://w/") is None
    assert "outside" in await policy.aviolation("http://127.0.0.1/")
    assert "user information" in await policy.aviolation("http://a@w/")


def counting_dns(table):
    lookups: list[str] = []

    def resolve(host):
        lookups.append(host)
        return fake_dns(table)(host)

    return resolve, lookups


async def test_admin_violation_judges_the_prefix_every_admin_url_starts_with():
    policy = OutboundPolicy.from_cidrs(["10.0.0.0/8"])
    assert await policy.admin_violation("http://10.0.0.7:9090") is None
    assert await policy.admin_violation("http://10.0.0.7:9090/w/") is None
    assert "outside" in await policy.admin_violation("http://127.0.0.1:9090")
    assert "user information" in await policy.admin_violation("http://a@10.0.0.7:9090")
    # No host before the first slash: the appended route cannot supply one.
    assert "no host" in await policy.admin_violation("http:")
    assert "no host" in await policy.admin_violation("http://")


async def test_a_run_policy_resolves_each_worker_name_once_a_plain_policy_every_time():
    resolve, lookups = counting_dns({"w1": ["10.0.0.2"], "evil": ["169.254.169.254"]})
    plain = OutboundPolicy.from_cidrs(["10.0.0.0/8"], resolver=resolve)
    for _ in range(3):
        assert await plain.admin_violation("http://w1:9090") is None
    assert lookups == ["w1", "w1", "w1"]

    lookups.clear()
    run = plain.for_run()
    assert run == plain  # the same allowlist, judged the same way
    for _ in range(3):
        assert await run.admin_violation("http://w1:9090") is None
        assert "outside" in await run.admin_violation("http://evil:9090")
        assert await run.aviolation("http://w1:9090/engine/pause_generation") is None
    assert sorted(lookups) == ["evil", "w1"]


@settings(max_examples=3_000, deadline=None, database=None)
@given(
    st.sampled_from(["http://", "https://", "HTTP://", "http:/", "ftp://", ""]),
    st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x7F), max_size=40),
)
def test_memo_key_of_a_plain_url_is_what_urlsplit_reads(prefix, rest):
    # The memo key skips urlsplit for plain URLs; it must name the same origin it would.
    url = prefix + rest
    policy = OutboundPolicy.from_cidrs(["10.0.0.0/8"])
    try:
        parts = urlsplit(url)
    except ValueError:
        parts = None
    key = policy._memo_key(url)
    if parts is not None:
        assert key == (parts.scheme, parts.netloc)
    elif key is not None:  # urlsplit refuses it: every URL of that origin gets one verdict
        assert policy.violation(url) == policy.violation(f"{key[0]}://{key[1]}/other")
        assert policy.violation(url).startswith("invalid URL")
