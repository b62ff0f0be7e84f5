"""ASGI entry point: HTTP through Django, websockets through Channels with session auth."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402  (needs Django set up first)
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import OriginValidator  # noqa: E402
from django.conf import settings  # noqa: E402

from controlplane.intake.api import fast_gate  # noqa: E402
from controlplane.nul import refuse_nul_in_scope  # noqa: E402
from controlplane.realtime.fanout import with_socket_writers  # noqa: E402
from controlplane.routing import websocket_urlpatterns  # noqa: E402


class BrowserOriginValidator(OriginValidator):
    """Refuse a websocket opened by a page from another site; admit clients that send no Origin.

    Browsers always send Origin on a websocket handshake, so a missing one cannot be a
    cross-site page (what this check is for). Bearer-token clients of `ws/gates/` — rollout
    frameworks using e.g. `websockets` or `aiohttp` — send none by default, and channels'
    `AllowedHostsOriginValidator` would refuse them all.
    """

    def valid_origin(self, parsed_origin):
        return parsed_origin is None or super().valid_origin(parsed_origin)


def _allowed_origins() -> list[str]:
    # As channels' AllowedHostsOriginValidator: ALLOWED_HOSTS, loopback under DEBUG when unset.
    if settings.DEBUG and not settings.ALLOWED_HOSTS:
        return ["localhost", "127.0.0.1", "[::1]"]
    return list(settings.ALLOWED_HOSTS)


# NUL in a path or query string is refused before anything reads it: the fast gate and the
# websocket streams come before Django's middleware (controlplane/nul.py).
application = refuse_nul_in_scope(
    ProtocolTypeRouter(
        {
            # Gate polls with a cached token and gate are answered before Django (see there).
            "http": fast_gate.wrap(django_asgi_app),
            # Outermost, to see the server's own send: live streams write frames to the socket.
            "websocket": with_socket_writers(
                BrowserOriginValidator(
                    AuthMiddlewareStack(URLRouter(websocket_urlpatterns)), _allowed_origins()
                )
            ),
        }
    )
)
