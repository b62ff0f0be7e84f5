"""Start, watch and stop the child processes of the embedded runtime.

Each child gets its own session (process group), so a Ctrl-C in the terminal reaches only the
supervisor, which then stops the children in reverse start order: the web server first, the
embedded Redis last. A child that exits on its own brings the whole runtime down rather than
leaving a half-working product behind.
"""

import contextlib
import io
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, cast


@dataclass
class Child:
    name: str
    process: subprocess.Popen
    log_path: Path

    def alive(self) -> bool:
        return self.process.poll() is None


@dataclass
class Supervisor:
    log_dir: Path
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    children: list[Child] = field(default_factory=list)

    def start(
        self,
        name: str,
        argv: list[str],
        *,
        capture_stdout: bool = False,
        extra_env: dict[str, str] | None = None,
    ) -> Child:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        log = open(log_path, "ab")  # noqa: SIM115  (owned by the child for its lifetime)
        process = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE if capture_stdout else log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            env=self.env | (extra_env or {}),
            start_new_session=True,
        )
        child = Child(name, process, log_path)
        self.children.append(child)
        return child

    def read_lines_until(self, child: Child, keys: set[str], timeout: float) -> dict[str, str]:
        """Read `key=value` lines from a child's stdout until every key was seen.

        The rest of its stdout is then copied to its log by a thread, so the pipe never fills.
        """
        found: dict[str, str] = {}
        deadline = time.monotonic() + timeout
        stream = child.process.stdout
        assert stream is not None
        while not keys <= found.keys():
            if time.monotonic() > deadline or not child.alive():
                raise RuntimeError(
                    f"{child.name} did not report {sorted(keys - found.keys())}; "
                    f"see {child.log_path}"
                )
            line = stream.readline().decode(errors="replace").strip()
            key, sep, value = line.partition("=")
            if sep:
                found[key] = value
        threading.Thread(target=_drain, args=(stream, child.log_path), daemon=True).start()
        return found

    def forget(self, child: Child) -> None:
        """Drop a child that exited during its start (and was replaced): it must not bring
        the runtime down later as "exited on its own"."""
        if child.alive():
            raise ValueError(f"{child.name} is still running")
        self.children.remove(child)

    def first_exited(self) -> Child | None:
        return next((c for c in self.children if not c.alive()), None)

    def stop_all(self, timeout: float = 10.0) -> None:
        for child in reversed(self.children):
            _signal_group(child, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for child in reversed(self.children):
            try:
                child.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(child, signal.SIGKILL)
                child.process.wait()
        # Grandchildren (e.g. Celery pool threads live in-process, but be thorough).
        for child in self.children:
            _signal_group(child, signal.SIGKILL)


def _signal_group(child: Child, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.process.pid, sig)


def _drain(stream: IO[bytes], log_path: Path) -> None:
    # A pipe from Popen is a BufferedReader: read1 returns what is there instead of waiting
    # for a full block, so the log follows the child line by line.
    pipe = cast(io.BufferedReader, stream)
    with open(log_path, "ab") as log:
        for chunk in iter(lambda: pipe.read1(4096), b""):
            log.write(chunk)
            log.flush()


def python_argv(*args: str) -> list[str]:
    return [sys.executable, *args]
