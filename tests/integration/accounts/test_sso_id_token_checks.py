"""A provider's ID token that fails a check is a refusal with its reason, never an error page.

The real provider (tests/sso_idp) is made to misbehave the ways real ones do: a token already
expired, a clock running ahead, a numeric subject, several audiences with no authorized party.
Each lands on the sign-in page with the reason and writes `auth.login_failed` naming it; a clock
off by less than `OIDC_CLOCK_SKEW_SECONDS` still signs in.
"""

import html

import pytest
from django.contrib.auth import get_user_model

from controlplane.accounts.roles import Role, role_of
from controlplane.audit.actions import AuditAction
from controlplane.audit.models import AuditEvent
from tests.integration.accounts.sso_flow import CLIENT_ID, CLOCK_SKEW_SECONDS, sign_in_with_sso

REFUSED = [
    ("expired", {"exp": -60}, "the provider's ID token has expired"),
    ("early", {"iat": 30}, "the provider's ID token is dated in the future"),
    ("numeric-sub", {"sub": 12345}, "the provider's ID token names its subject with no string"),
    (
        "no-azp",
        {"aud": [CLIENT_ID, "another-client"]},
        "the ID token has a list of audiences and no authorized party",
    ),
    (
        "other-azp",
        {"aud": [CLIENT_ID, "another-client"], "azp": "another-client"},
        "ID token authorized for another client",
    ),
]


@pytest.mark.parametrize(("name", "tweak", "reason"), REFUSED, ids=[r[0] for r in REFUSED])
def test_a_bad_id_token_is_refused_with_its_reason(
    provider, control_plane, transactional_db, name, tweak, reason
):
    assert CLOCK_SKEW_SECONDS < 30  # the early token is beyond the skew allowed
    provider.person(name, "rl-admins", id_token=tweak)

    _, landed = sign_in_with_sso(control_plane, name)

    assert [r.status_code for r in landed.history if r.status_code >= 500] == []
    assert landed.status_code == 200 and landed.url.path == "/accounts/login/"
    assert f"Single sign-on did not let you in: {reason}." in html.unescape(landed.text)
    [failed] = AuditEvent.objects.filter(action=AuditAction.LOGIN_FAILED, details__via="sso")
    assert failed.details["reason"] == reason
    assert not get_user_model().objects.filter(username=name).exists()
    assert not AuditEvent.objects.filter(action=AuditAction.LOGIN_SUCCEEDED).exists()


ACCEPTED = [
    ("ahead-within-skew", {"iat": CLOCK_SKEW_SECONDS // 2}),
    ("expired-within-skew", {"exp": -(CLOCK_SKEW_SECONDS // 2)}),
    ("azp-is-us", {"aud": [CLIENT_ID, "another-client"], "azp": CLIENT_ID}),
]


@pytest.mark.parametrize(("name", "tweak"), ACCEPTED, ids=[a[0] for a in ACCEPTED])
def test_a_token_within_the_rules_signs_in(provider, control_plane, transactional_db, name, tweak):
    provider.person(name, "rl-viewers", id_token=tweak)

    _, landed = sign_in_with_sso(control_plane, name)

    assert landed.url.path == "/", html.unescape(landed.text)[:2000]
    assert role_of(get_user_model().objects.get(username=name)) == Role.VIEWER
    assert not AuditEvent.objects.filter(action=AuditAction.LOGIN_FAILED).exists()
