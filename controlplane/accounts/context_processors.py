from django.conf import settings

from controlplane.accounts.roles import Perm, role_of


def role(request):
    """The signed-in user's role, shown in the page header."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {"user_role": None}
    return {"user_role": role_of(user)}


def runtime_notice(request):
    """`settings.RUNTIME_NOTICE` for people who act (not viewers): this web server does not use
    the running demo's Redis or database, so what they start here may never run there."""
    notice = settings.RUNTIME_NOTICE
    user = getattr(request, "user", None)
    if not notice or user is None or not user.is_authenticated:
        return {"runtime_notice": ""}
    acts = (Perm.OPERATE_REFRESH, Perm.APPROVE_REFRESH, Perm.MANAGE_SOURCES)
    return {"runtime_notice": notice if any(user.has_perm(p) for p in acts) else ""}
