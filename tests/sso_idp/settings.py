"""A real OpenID provider for the single sign-on tests: django-oauth-toolkit with OIDC on.

Runs as its own process (`python -m django runserver` with these settings), on its own SQLite
database, so the control plane under test talks to it over HTTP exactly as to any provider.
Its cookies have their own names: the test's HTTP client holds both sites' cookies.
"""

import os
from pathlib import Path

BASE = Path(__file__).resolve().parent
SECRET_KEY = "test-idp-" + "x" * 50
DEBUG = False
ALLOWED_HOSTS = ["localhost", "127.0.0.1"]
INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "oauth2_provider",
    "tests.sso_idp",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
]
ROOT_URLCONF = "tests.sso_idp.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {"context_processors": ["django.template.context_processors.request"]},
    }
]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["IDP_DB"]}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
SESSION_COOKIE_NAME = "idp_session"
CSRF_COOKIE_NAME = "idp_csrf"
LOGIN_URL = "/accounts/login/"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # test speed only
OAUTH2_PROVIDER = {
    "OIDC_ENABLED": True,
    "OIDC_RSA_PRIVATE_KEY": os.environ.get("IDP_RSA_PRIVATE_KEY", ""),
    "OIDC_ISS_ENDPOINT": os.environ.get("IDP_ISSUER", ""),
    # As most providers are by default; a test turns it off to stand for those that are not.
    "PKCE_REQUIRED": os.environ.get("IDP_PKCE_REQUIRED", "true") == "true",
    "SCOPES": {"openid": "OpenID Connect", "profile": "Profile", "email": "Email"},
    "OAUTH2_VALIDATOR_CLASS": "tests.sso_idp.validator.GroupsValidator",
}
