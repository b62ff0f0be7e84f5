"""A local receiver for outbound notifications, and the objects they are about."""

import base64
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from controlplane.fleet.models import Source

SECRET = "whsec_" + base64.b64encode(b"s" * 32).decode()


@pytest.fixture
def source(db):
    return Source.objects.create(
        name="src-a", listener_url="http://127.0.0.1:9/", allowed_networks=["127.0.0.0/8"]
    )


@pytest.fixture
def receiver():
    """A local HTTP receiver answering the scripted statuses in order, then 200."""
    state = {"script": [], "received": []}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["content-length"]))
            state["received"].append(({k.lower(): v for k, v in self.headers.items()}, body))
            status = state["script"].pop(0) if state["script"] else 200
            self.send_response(status)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    state["url"] = f"http://127.0.0.1:{server.server_port}/hook"
    yield state
    server.shutdown()
