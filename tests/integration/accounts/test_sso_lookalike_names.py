# ruff: noqa: RUF001, RUF002, RUF003 (look-alike letters are what these tests are about)
"""No account can be added whose name reads like an existing one's.

`RT_ADMIN` and `rt_admіn` (a Cyrillic і) from the provider, next to a local `rt_admin`, are
refused at sign-in with the reason (audited as `auth.login_failed`), and a local account
cannot be created under such a name either: names compare by skeleton (NFKC, Cyrillic and
Greek look-alikes mapped to Latin, casefolded: controlplane/accounts/usernames.py).
"""

import html

import pytest
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError

from controlplane.accounts.models import SsoIdentity
from controlplane.accounts.roles import Role
from controlplane.accounts.services import create_user_with_role
from controlplane.accounts.usernames import skeleton
from controlplane.audit.actions import AuditAction
from controlplane.audit.models import AuditEvent
from tests.conftest import PASSWORD
from tests.integration.accounts.sso_flow import sign_in_with_sso

LOOK_ALIKES = ["RT_ADMIN", "rt_admіn", "rt_аdmin", "Rt_Αdmin"]  # і, а Cyrillic; Α Greek


def _local_admin():
    return create_user_with_role("rt_admin", Role.ADMIN, PASSWORD, validate=False)


@pytest.mark.parametrize("name", LOOK_ALIKES)
def test_a_look_alike_of_a_local_account_is_refused_at_sign_in(
    provider, control_plane, transactional_db, name
):
    local = _local_admin()
    provider.person(name, "rl-admins")

    _, landed = sign_in_with_sso(control_plane, name)

    reason = f"the user name {name!r} looks like an existing account's"
    assert landed.url.path == "/accounts/login/"
    assert f"Single sign-on did not let you in: {reason}." in html.unescape(landed.text)
    [failed] = AuditEvent.objects.filter(action=AuditAction.LOGIN_FAILED)
    assert failed.details == {"via": "sso", "reason": reason}
    assert failed.actor_label == name
    assert list(get_user_model().objects.values_list("pk", flat=True)) == [local.pk]
    assert not SsoIdentity.objects.exists()


def test_a_name_unlike_any_account_still_signs_in(provider, control_plane, transactional_db):
    _local_admin()
    provider.person("rt_admins", "rl-viewers")  # one letter more: another name
    _, landed = sign_in_with_sso(control_plane, "rt_admins")
    assert landed.url.path == "/"
    assert get_user_model().objects.filter(username="rt_admins").exists()


@pytest.mark.parametrize("name", [*LOOK_ALIKES, "ｒｔ＿ａｄｍｉｎ"])
def test_a_local_account_cannot_take_a_look_alike_name(db, name):
    _local_admin()
    with pytest.raises(ValidationError) as refused:
        create_user_with_role(name, Role.VIEWER, PASSWORD, validate=False)
    assert "rt_admin" in str(refused.value)
    assert get_user_model().objects.count() == 1
    assert not AuditEvent.objects.filter(details__username=name).exists()


def test_names_are_stored_nfkc_and_compared_by_skeleton(db):
    user = create_user_with_role("ｏｐｓ", Role.VIEWER, PASSWORD, validate=False)  # fullwidth
    assert user.username == "ops"
    assert skeleton("Ops") == skeleton("оps") == skeleton("ops")  # Cyrillic о
    assert skeleton("w0rker1") == skeleton("workerl")  # digits drawn like letters
    assert skeleton("ops") != skeleton("opz")
