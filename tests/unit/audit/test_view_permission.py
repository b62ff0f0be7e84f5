"""audit names the permission its pages need instead of importing accounts (which sits above
it); the name must stay the one accounts grants."""

from controlplane.accounts.roles import Perm
from controlplane.audit import views


def test_history_pages_check_the_viewer_permission_accounts_grants():
    assert views.VIEW_PERMISSION == Perm.VIEW
