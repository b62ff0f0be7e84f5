from django.urls import path

from controlplane.fleet import consumers

websocket_urlpatterns: list = [
    path("ws/fleet/", consumers.FleetOverviewConsumer.as_asgi()),
    path("ws/fleet/sources/<int:source_id>/", consumers.SourceStreamConsumer.as_asgi()),
]
