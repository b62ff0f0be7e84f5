"""Websocket routes of every app, collected in one list for the ASGI router."""

from controlplane.fleet.routing import websocket_urlpatterns as fleet_streams
from controlplane.intake.routing import websocket_urlpatterns as intake_streams
from controlplane.refresh.routing import websocket_urlpatterns as refresh_streams

websocket_urlpatterns = [*fleet_streams, *refresh_streams, *intake_streams]
