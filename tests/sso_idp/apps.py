from django.apps import AppConfig


class SsoIdpConfig(AppConfig):
    name = "tests.sso_idp"
    label = "sso_idp"
