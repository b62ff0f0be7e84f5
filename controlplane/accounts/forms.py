"""The login form's own authentication: passwords, checked by the model backend alone."""

from __future__ import annotations

from django.contrib.auth import load_backend, user_login_failed
from django.contrib.auth.forms import AuthenticationForm

#: Local (break-glass) accounts: the only backend the login form asks.
LOCAL_BACKEND = "django.contrib.auth.backends.ModelBackend"


class LocalLoginForm(AuthenticationForm):
    """Django's login form, asking the model backend only.

    `django.contrib.auth.authenticate` would try every configured backend, and the single
    sign-on one reads `code` and `state` from the query string: a login form posted to
    `/accounts/login/?code=...` must never turn into a code exchange.
    """

    def clean(self):
        username = self.cleaned_data.get("username")
        password = self.cleaned_data.get("password")
        if username is not None and password:
            backend = load_backend(LOCAL_BACKEND)
            user = backend.authenticate(self.request, username=username, password=password)
            if user is None:
                user_login_failed.send(
                    sender=__name__, credentials={"username": username}, request=self.request
                )
                raise self.get_invalid_login_error()
            user.backend = LOCAL_BACKEND  # what auth.login records in the session
            self.user_cache = user
            self.confirm_login_allowed(user)
        return self.cleaned_data
