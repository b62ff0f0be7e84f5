from django.urls import path

from controlplane.fleet import metrics, views

app_name = "fleet"

urlpatterns = [
    path("", views.overview, name="overview"),
    path("sources/new/", views.source_create, name="source_create"),
    path("sources/<int:pk>/", views.source_detail, name="source"),
    path("sources/<int:pk>/edit/", views.source_edit, name="source_edit"),
    path("sources/<int:pk>/map/", views.source_map, name="source_map"),
    path("sources/<int:pk>/map.json", views.source_map_data, name="source_map_data"),
    path("sources/<int:pk>/serving-health/", views.serving_health, name="serving_health"),
    path("sources/<int:pk>/delete/", views.source_delete, name="source_delete"),
    path("sources/<int:pk>/discovery/", views.run_discovery, name="run_discovery"),
    path(
        "sources/<int:pk>/static-workers/new/",
        views.static_worker_create,
        name="static_worker_create",
    ),
    path(
        "static-workers/<int:pk>/delete/", views.static_worker_delete, name="static_worker_delete"
    ),
    path("workers/<int:pk>/", views.worker_detail, name="worker"),
    path("metrics", metrics.metrics, name="metrics"),
]
