from django.urls import path

from controlplane.fleet import views

app_name = "fleet"

urlpatterns = [
    path("", views.overview, name="overview"),
]
