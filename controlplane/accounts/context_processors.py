from controlplane.accounts.roles import role_of


def role(request):
    """The signed-in user's role, shown in the page header."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {"user_role": None}
    return {"user_role": role_of(user)}
