from django.urls import path

from controlplane.refresh import consumers, inbox, list_views

websocket_urlpatterns: list = [
    path("ws/refreshes/<int:refresh_id>/", consumers.RefreshConsumer.as_asgi()),
    path("ws/refresh-banner/<int:source_id>/", consumers.BannerConsumer.as_asgi()),
    path("ws/gate-table/", consumers.GateTableConsumer.as_asgi()),
    path("ws/inbox/", inbox.InboxConsumer.as_asgi()),
    path("ws/refresh-list/", list_views.RefreshListConsumer.as_asgi()),
]
