from django.urls import path

from controlplane.accounts import sso_views, views

app_name = "accounts"

urlpatterns = [
    path("login/", views.login, name="login"),
    path("logout/", views.logout, name="logout"),
    path("sso/login/", sso_views.sso_login, name="sso_login"),
    path("sso/callback/", sso_views.sso_callback, name="sso_callback"),
]
