from django.urls import include, path

urlpatterns = [
    path("", include("controlplane.fleet.urls")),
    path("refreshes/", include("controlplane.refresh.urls")),
    path("", include("controlplane.intake.urls")),
    path("accounts/", include("controlplane.accounts.urls")),
    path("history/", include("controlplane.audit.urls")),
    path("versions/", include("controlplane.intake.provenance.urls")),
]
