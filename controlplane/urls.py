from django.urls import include, path

urlpatterns = [
    path("", include("controlplane.fleet.urls")),
    path("refreshes/", include("controlplane.refresh.urls")),
    path("", include("controlplane.intake.urls")),
    path("accounts/", include("controlplane.accounts.urls")),
    path("history/", include("controlplane.audit.urls")),
    path("versions/", include("controlplane.intake.provenance.urls")),
    path("search/", include("controlplane.intake.search.urls")),
]

handler403 = "controlplane.errors.permission_denied"
handler404 = "controlplane.errors.page_not_found"
handler500 = "controlplane.errors.server_error"
