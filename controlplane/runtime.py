"""The demo's runtime file: which Redis and database a running `manage.py demo` uses.

The demo starts its Redis on a free port, so a `manage.py refresh …` in a second terminal
would otherwise fall back to 127.0.0.1:6379 and enqueue work no worker of the demo ever
reads. While it runs, the demo writes `<VAR_DIR>/demo-runtime.json` (its pid, its Redis URL,
its database URL and Redis key prefix); settings read it for every setting the environment
does not give (the environment always wins), and the demo removes it when it stops. A file
whose process is gone (a demo killed with SIGKILL, a reboot) is ignored: its pid must be alive
and, where /proc tells, the same process that wrote it (a pid is reused after a while).

Nothing here imports Django's settings: `controlplane/settings.py` imports this module.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

FILE_NAME = "demo-runtime.json"


def runtime_path(var_dir: Path) -> Path:
    return Path(var_dir) / FILE_NAME


def default_database_url(var_dir: Path) -> str:
    """The development database when neither the environment nor a demo names one."""
    return f"sqlite:///{Path(var_dir) / 'controlplane.sqlite3'}"


@dataclass(frozen=True)
class DemoRuntime:
    pid: int
    #: What identifies the process beyond its pid (its start time in /proc), "" where unknown.
    process_start: str
    redis_url: str
    database_url: str
    redis_key_prefix: str


def process_start(pid: int) -> str:
    """The process's start time in clock ticks since boot (field 22 of /proc/<pid>/stat), or
    "" where /proc is not there to say. A reused pid has another start time."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    # The command name (field 2) may hold spaces and parentheses: fields 3… follow the last ")".
    fields = stat.rpartition(")")[2].split()
    return fields[19] if len(fields) > 19 else ""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    return True


def is_live(runtime: DemoRuntime) -> bool:
    if runtime.pid <= 0 or not _alive(runtime.pid):
        return False
    return not runtime.process_start or process_start(runtime.pid) == runtime.process_start


def write_runtime(
    var_dir: Path, *, redis_url: str, database_url: str, redis_key_prefix: str
) -> DemoRuntime:
    """Write this process's runtime file (owner-only: a database URL may carry a password)."""
    pid = os.getpid()
    runtime = DemoRuntime(
        pid=pid,
        process_start=process_start(pid),
        redis_url=redis_url,
        database_url=database_url,
        redis_key_prefix=redis_key_prefix,
    )
    path = runtime_path(var_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{FILE_NAME}.{pid}")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(asdict(runtime), out, indent=2)
    os.replace(partial, path)  # a reader sees the old file or the whole new one
    return runtime


def read_runtime(var_dir: Path) -> DemoRuntime | None:
    """The file as written, live or not; None when absent or unreadable."""
    try:
        raw = json.loads(runtime_path(var_dir).read_text())
        return DemoRuntime(
            pid=int(raw["pid"]),
            process_start=str(raw.get("process_start", "")),
            redis_url=str(raw["redis_url"]),
            database_url=str(raw["database_url"]),
            redis_key_prefix=str(raw.get("redis_key_prefix", "")),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def read_live_runtime(var_dir: Path) -> DemoRuntime | None:
    """The running demo's settings, or None when no demo of this var dir is running."""
    runtime = read_runtime(var_dir)
    return runtime if runtime is not None and is_live(runtime) else None


def remove_runtime(var_dir: Path) -> None:
    """Remove the file if this process wrote it (a second demo's file is not ours to remove)."""
    runtime = read_runtime(var_dir)
    if runtime is not None and runtime.pid == os.getpid():
        with contextlib.suppress(FileNotFoundError):
            runtime_path(var_dir).unlink()


def redacted(url: str) -> str:
    """A URL fit to print: any password replaced by ***."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def _same_redis(a: str, b: str) -> bool:
    from redis.connection import parse_url

    try:
        pa, pb = parse_url(a), parse_url(b)
    except ValueError:
        return a == b
    defaults = {"host": "localhost", "port": 6379, "db": 0, "path": None}
    return all(pa.get(k, d) == pb.get(k, d) for k, d in defaults.items())


def _same_database(a: str, b: str) -> bool:
    import dj_database_url

    try:
        pa, pb = dj_database_url.parse(a), dj_database_url.parse(b)
    except Exception:  # dj-database-url raises several types for bad URLs
        return a == b
    keys = ("ENGINE", "NAME", "HOST", "PORT")
    return all(str(pa.get(k) or "") == str(pb.get(k) or "") for k in keys)


def runtime_notice(
    demo: DemoRuntime | None, *, redis_url: str, database_url: str, redis_key_prefix: str
) -> str:
    """One line saying what this process uses that the running demo does not, or ""."""
    if demo is None:
        return ""
    differs = []
    if not _same_redis(redis_url, demo.redis_url):
        differs.append(f"Redis {redacted(redis_url)} (the demo's: {redacted(demo.redis_url)})")
    elif redis_key_prefix != demo.redis_key_prefix:
        differs.append(
            f"Redis key prefix {redis_key_prefix!r} (the demo's: {demo.redis_key_prefix!r})"
        )
    if not _same_database(database_url, demo.database_url):
        differs.append(
            f"database {redacted(database_url)} (the demo's: {redacted(demo.database_url)})"
        )
    if not differs:
        return ""
    return (
        f"Not the running demo's runtime (pid {demo.pid}): this process uses "
        + " and ".join(differs)
        + ". REDIS_URL / DATABASE_URL in the environment win over the demo's."
    )
