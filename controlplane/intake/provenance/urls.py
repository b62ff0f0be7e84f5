from django.urls import path

from controlplane.intake.provenance import views

app_name = "provenance"

# `path:` because a trainer's version may contain a slash.
urlpatterns = [
    path("<path:version>/provenance/", views.version_provenance, name="version"),
]
