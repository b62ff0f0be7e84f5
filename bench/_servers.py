"""What the server benches share: a throwaway database, a viewer session, the real ASGI server.

Importing this module configures the bench process before Django is set up: DEBUG off (the
server inherits it), a var dir and a Redis key prefix of the bench's own, so a bench never
reads or leaves state of a running control plane.

The server under test is `uvicorn controlplane.asgi:application --workers N`, as production
runs it (deploy/, Dockerfile), in a process group of its own so `stop` ends it and its workers.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
os.environ.setdefault("CONTROLPLANE_VAR_DIR", tempfile.mkdtemp(prefix="bench-var-"))
os.environ["DEBUG"] = "false"
os.environ.setdefault("REDIS_KEY_PREFIX", f"bench-{uuid.uuid4().hex[:12]}:")

ASGI_APP = "controlplane.asgi:application"
#: Seconds the server gets to answer its first request.
START_TIMEOUT_SECONDS = 60.0


# -- the throwaway database ------------------------------------------------------------------


def with_database(url: str, name: str, query: str | None = None) -> str:
    """`url` pointing at database `name`; `query` replaces the URL's own when given."""
    parts = urlsplit(url)
    query = parts.query if query is None else query
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", query, ""))


def admin_connect(url: str, application_name: str = "cp-bench-admin"):
    """An autocommit connection to the server's `postgres` database (create, drop, sample)."""
    import psycopg

    parts = urlsplit(url)
    return psycopg.connect(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 5432,
        user=parts.username,
        password=parts.password,
        dbname="postgres",
        autocommit=True,
        application_name=application_name,
    )


@contextlib.contextmanager
def throwaway_database(prefix: str, why: str = "the bench needs PostgreSQL") -> Iterator[str]:
    """A new database on the server `DATABASE_URL` points at, migrated, as this process's
    `DATABASE_URL` (Django is set up inside); dropped on the way out, whatever happened.
    Yields its name."""
    base_url = os.environ.get("DATABASE_URL", "")
    if not base_url.startswith(("postgres://", "postgresql://")):
        raise SystemExit(f"DATABASE_URL must point at PostgreSQL: {why}")
    dbname = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with admin_connect(base_url) as admin:
        admin.execute(f'CREATE DATABASE "{dbname}"')
    os.environ["DATABASE_URL"] = with_database(base_url, dbname)
    try:
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", interactive=False, verbosity=0)
        yield dbname
    finally:
        from django.db import connections

        connections.close_all()
        for conn in connections.all():
            if hasattr(conn, "close_pool"):
                conn.close_pool()
        os.environ["DATABASE_URL"] = base_url
        with admin_connect(base_url) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')


def server_database_url(dbname: str, application_name: str) -> str:
    """The throwaway database's URL for the server, its connections named for sampling."""
    return with_database(os.environ["DATABASE_URL"], dbname, f"application_name={application_name}")


def session_cookie(username: str = "bench-viewer") -> dict[str, str]:
    """A signed-in viewer's session cookie (name -> value), as a browser would hold it."""
    from django.conf import settings
    from django.test import Client

    from controlplane.accounts.roles import Role
    from controlplane.accounts.services import create_user_with_role

    user = create_user_with_role(username, Role.VIEWER, uuid.uuid4().hex, validate=False)
    client = Client()
    client.force_login(user)
    return {settings.SESSION_COOKIE_NAME: client.cookies[settings.SESSION_COOKIE_NAME].value}


# -- processes ---------------------------------------------------------------------------------


def free_port() -> int:
    from controlplane.embedded.redis import free_port as free

    return free()


@dataclass
class Server:
    process: subprocess.Popen
    url: str
    profiled: bool = False

    def stop(self) -> None:
        stop([self.process], signal.SIGINT if self.profiled else signal.SIGTERM)

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])


def start_uvicorn(
    database_url: str,
    workers: int,
    *,
    process: str = "web",
    profile_to: Path | None = None,
    ready_path: str = "/accounts/login/",
    ready_headers: dict[str, str] | None = None,
) -> Server:
    """`uvicorn --workers N` on a free port, DEBUG off, answering `ready_path` when returned.

    `process` is CONTROLPLANE_PROCESS (web: pooled database connections). `profile_to` runs
    one worker in the main process under cProfile and writes its stats there on `stop`.
    """
    port = free_port()
    env = dict(os.environ, DATABASE_URL=database_url, CONTROLPLANE_PROCESS=process)
    command = [sys.executable]
    if profile_to is not None:
        if workers != 1:
            raise SystemExit("profiling needs --workers 1 (uvicorn then serves in-process)")
        command += ["-m", "cProfile", "-o", str(profile_to)]
    command += ["-m", "uvicorn", ASGI_APP, "--host", "127.0.0.1", "--port", str(port)]
    command += ["--workers", str(workers), "--log-level", "warning", "--no-access-log"]
    started = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, start_new_session=True
    )
    server = Server(started, f"http://127.0.0.1:{port}", profiled=profile_to is not None)
    try:
        wait_until_up(server.url + ready_path, started, ready_headers or {})
    except BaseException:
        stop([started])
        raise
    return server


def wait_until_up(url: str, process: subprocess.Popen | None, headers: dict[str, str]) -> None:
    """Poll `url` until it answers 2xx/3xx; exit the bench if it answers an error or the
    process dies or it takes longer than START_TIMEOUT_SECONDS."""
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=2):
                return
        except urllib.error.HTTPError as exc:
            raise SystemExit(f"{url} answered {exc.code} at start") from None
        except OSError:
            if process is not None and process.poll() is not None:
                raise SystemExit(f"the server for {url} exited at start") from None
            time.sleep(0.2)
    raise SystemExit(f"{url} did not start")


def stop(processes: list[subprocess.Popen], how: int = signal.SIGTERM) -> None:
    """Signal each process group (`how`: SIGTERM, or SIGINT for a profiled server, which
    uvicorn re-raises after its graceful shutdown as KeyboardInterrupt, so cProfile writes its
    stats), then kill what is still there after 15 s."""
    for process in processes:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, how)
    for process in processes:
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants (uvicorn's supervisor and workers), by parent id in /proc."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                parents.setdefault(parent, []).append(int(entry.name))
    found, pending = [], [pid]
    while pending:
        current = pending.pop()
        found.append(current)
        pending += parents.get(current, [])
    return found


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds used so far by `pids` (Linux /proc; gone ones count 0)."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def start_celery(database_url: str, role: list[str], *, log_path: Path) -> subprocess.Popen:
    """`celery -A controlplane <role...>` (a worker or beat) as deploy/ runs it, with persistent
    database connections (CONTROLPLANE_PROCESS=celery), in a process group of its own so `stop`
    ends it and its children; its output goes to `log_path`. Returns once started: a worker is
    ready when it takes its first task, so a caller that needs it waits for one."""
    env = dict(os.environ, DATABASE_URL=database_url, CONTROLPLANE_PROCESS="celery")
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "controlplane", *role],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )


def delete_bench_keys() -> None:
    """Drop every Redis key this bench wrote: all sit under its own REDIS_KEY_PREFIX (the
    cache, the channel layer, the gate copies and the Celery broker's queues alike)."""
    import redis

    prefix = os.environ["REDIS_KEY_PREFIX"]
    client = redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    with contextlib.suppress(redis.RedisError):
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        for start in range(0, len(keys), 1000):
            client.unlink(*keys[start : start + 1000])
