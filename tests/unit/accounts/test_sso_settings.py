"""Single sign-on configuration: the role map, and local sign-in turned off for break-glass."""

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from controlplane.accounts.rolemap import groups_from_claim, parse_role_map, role_for_groups
from controlplane.accounts.roles import Role
from controlplane.audit.actions import AuditAction
from controlplane.audit.models import AuditEvent
from tests.conftest import PASSWORD
from tests.unit.test_settings import _run_check


def test_role_map_parses_group_equals_role():
    assert parse_role_map(["rl-admins=admin", " ops = operator "], "X") == {
        "rl-admins": Role.ADMIN,
        "ops": Role.OPERATOR,
    }


@pytest.mark.parametrize("bad", ["admins", "=admin", "admins=root"])
def test_role_map_rejects_bad_entries_naming_the_variable(bad):
    with pytest.raises(ImproperlyConfigured, match="OIDC_ROLE_MAP"):
        parse_role_map([bad], "OIDC_ROLE_MAP")


def test_highest_mapped_role_wins_and_unmapped_groups_grant_nothing():
    mapping = {"a": Role.VIEWER, "b": Role.APPROVER, "c": Role.OPERATOR}
    assert role_for_groups(["a", "c", "b", "zzz"], mapping) == Role.APPROVER
    assert role_for_groups(["zzz"], mapping) is None
    assert groups_from_claim("a") == ["a"]
    assert groups_from_claim(["a", 3, None]) == ["a"]
    assert groups_from_claim({"a": 1}) == []


def test_login_page_has_no_sso_button_when_sso_is_off(client, db):
    page = client.get("/accounts/login/")
    assert b"Sign in with" not in page.content
    assert client.get("/accounts/sso/login/").status_code == 404
    assert client.get("/accounts/sso/callback/").status_code == 404


@override_settings(LOCAL_LOGIN_ENABLED=False, SSO_ENABLED=True, SSO_PROVIDER_NAME="Corp")
def test_local_sign_in_turned_off_refuses_even_a_right_password(client, admin_user):
    page = client.get("/accounts/login/")
    assert b"Sign in with Corp" in page.content
    assert b'id="id_password"' not in page.content
    response = client.post(
        "/accounts/login/", {"username": admin_user.username, "password": PASSWORD}
    )
    assert response.status_code == 403
    assert "_auth_user_id" not in client.session
    event = AuditEvent.objects.filter(action=AuditAction.LOGIN_FAILED).latest("sequence")
    assert event.details["reason"] == "local sign-in is turned off"


def test_sso_with_a_missing_endpoint_stops_start_up():
    result = _run_check({"OIDC_RP_CLIENT_ID": "cp", "OIDC_RP_CLIENT_SECRET": "s"})
    assert result.returncode != 0
    assert "OIDC_OP_ISSUER must be set" in result.stderr


def test_local_sign_in_off_without_sso_stops_start_up():
    result = _run_check({"LOCAL_LOGIN_ENABLED": "false"})
    assert result.returncode != 0
    assert "LOCAL_LOGIN_ENABLED=false needs single sign-on" in result.stderr


def test_trace_url_template_must_hold_the_trace_id():
    result = _run_check({"TRACE_URL_TEMPLATE": "https://traces.example/"})
    assert result.returncode != 0
    assert "TRACE_URL_TEMPLATE must contain {trace_id}" in result.stderr
