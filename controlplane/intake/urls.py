from django.urls import include, path

from controlplane.intake.api import urlpatterns as api_urlpatterns

app_name = "intake"

urlpatterns = [
    path("api/v1/", include((api_urlpatterns(), "api-v1"), namespace="api-v1")),
]
