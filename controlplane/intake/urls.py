from django.urls import include, path

from controlplane.intake import views
from controlplane.intake.api.site import urlpatterns as api_urlpatterns
from controlplane.intake.views import destinations, endpoints, tokens

app_name = "intake"

admin_tools = [
    path("", views.index, name="admin_index"),
    path("tokens/", tokens.token_list, name="token_list"),
    path("tokens/new/", tokens.token_create, name="token_create"),
    path("tokens/<int:pk>/created/", tokens.token_created, name="token_created"),
    path("tokens/<int:pk>/revoke/", tokens.token_revoke, name="token_revoke"),
    path("webhooks/", endpoints.endpoint_list, name="endpoint_list"),
    path("webhooks/new/", endpoints.endpoint_create, name="endpoint_create"),
    path("webhooks/<int:pk>/", endpoints.endpoint_detail, name="endpoint"),
    path("webhooks/<int:pk>/edit/", endpoints.endpoint_edit, name="endpoint_edit"),
    path("webhooks/<int:pk>/delete/", endpoints.endpoint_delete, name="endpoint_delete"),
    path("webhooks/<int:pk>/rotate/", endpoints.endpoint_rotate, name="endpoint_rotate"),
    path(
        "webhooks/<int:pk>/new-secret/",
        endpoints.endpoint_secret_shown,
        name="endpoint_secret_shown",
    ),
    path(
        "webhooks/<int:pk>/remove-secret/",
        endpoints.endpoint_remove_secret,
        name="endpoint_remove_secret",
    ),
    path("webhooks/<int:pk>/test/", endpoints.endpoint_test, name="endpoint_test"),
    path("notifications/", destinations.destination_list, name="destination_list"),
    path("notifications/new/", destinations.destination_create, name="destination_create"),
    path("notifications/<int:pk>/", destinations.destination_detail, name="destination"),
    path("notifications/<int:pk>/edit/", destinations.destination_edit, name="destination_edit"),
    path(
        "notifications/<int:pk>/delete/",
        destinations.destination_delete,
        name="destination_delete",
    ),
    path(
        "notifications/<int:pk>/secret/",
        destinations.destination_secret,
        name="destination_secret",
    ),
    path(
        "notifications/<int:pk>/new-secret/",
        destinations.destination_secret_shown,
        name="destination_secret_shown",
    ),
    path("notifications/<int:pk>/test/", destinations.destination_test, name="destination_test"),
]

urlpatterns = [
    path("api/v1/", include((api_urlpatterns(), "api-v1"), namespace="api-v1")),
    path("admin-tools/", include(admin_tools)),
]
