from django.urls import path

from controlplane.intake.search import views

app_name = "search"

urlpatterns = [path("", views.search_page, name="search")]
