from django.urls import path

from controlplane.audit import views

app_name = "audit"

urlpatterns = [
    path("", views.history, name="history"),
    path("export", views.export, name="export"),
]
