from django.urls import path

from controlplane.intake.consumers import GateStreamConsumer

websocket_urlpatterns = [path("ws/gates/", GateStreamConsumer.as_asgi())]
