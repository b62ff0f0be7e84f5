"""Harness that runs REAL NVIDIA Dynamo 1.6.1 processes on the CPU for interop tests.

`dynamo_deployment(...)` starts, per test: one frontend (`python -m dynamo.frontend`) with the RL
listener enabled, plus scripted workers (`programs/vllm_rl_worker.py`) on the real runtime, all
with file discovery in a fresh `DYN_FILE_KV` directory, the TCP request plane and loopback only.
It waits until the listener shows the expected workers and kills every process group afterwards.

The Dynamo processes use `.venv-dynamo` (built by `.ci/install-dynamo`), never the product venv.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.interop.programs.synthetic_model import write_model_dir

REPO_ROOT = Path(__file__).resolve().parents[2]
DYNAMO_VENV = REPO_ROOT / ".venv-dynamo"
DYNAMO_PYTHON = DYNAMO_VENV / "bin" / "python"
DYNAMO_STAMP = DYNAMO_VENV / ".dynamo-install-complete"
PROGRAMS = Path(__file__).resolve().parent / "programs"
WORKER_PROGRAM = PROGRAMS / "vllm_rl_worker.py"

# Frontend start-up imports a lot of Python; on the 2-core CI machine it has taken ~5 s.
READY_TIMEOUT_S = float(os.environ.get("INTEROP_READY_TIMEOUT_S", "90"))
# 1.6.1 parses DYN_SYSTEM_PORT as a signed 16-bit number, so every port we hand out stays below
# 32768. That range is also below Linux's ephemeral range (32768-60999), so the OS-assigned TCP
# request-plane ports of the workers never collide with the ports we pick.
_PORT_RANGE = (20000, 32767)
_ports_handed_out: set[int] = set()

# Inherited DYN_* variables (a developer's shell, CI) would silently change scope or discovery.
_SCRUBBED_PREFIXES = ("DYN_", "NATS_", "ETCD_")


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def free_port() -> int:
    """A currently free loopback TCP port below 32768 not yet used in this session."""
    rng = random.Random()
    for _ in range(500):
        port = rng.randint(*_PORT_RANGE)
        if port in _ports_handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _ports_handed_out.add(port)
        return port
    raise RuntimeError("no free loopback port below 32768")


@dataclass(frozen=True)
class WorkerSpec:
    """One scripted worker process.

    - `model_name`: also register a model card and serve generation (needs no extra files: the
      worker writes a tiny synthetic model directory under the test's tmp dir).
    - `probe_error`: the `rl` probe answers `{"status":"error","message":probe_error}`.
    - `omit_routes`: routes left out of registration (e.g. `update_weights_from_disk`).
    - `model_dir`: the model directory's name under the test's `models/` (default: the model
      name, so replicas of one model share it as replicas of one checkpoint do). Two names
      for one model give two different model cards (the path is in the card's checksum).
    """

    component: str
    namespace: str = "dynamo"
    model_name: str | None = None
    probe_error: str | None = None
    omit_routes: tuple[str, ...] = ()
    world_size: int = 1
    env: Mapping[str, str] = field(default_factory=dict)
    model_dir: str | None = None
    #: The rl probe answers this descriptor verbatim (e.g. one our parser rejects).
    probe_reply: Mapping[str, Any] | None = None


@dataclass
class RunningProcess:
    name: str
    proc: subprocess.Popen
    log_path: Path

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM the whole process group, then SIGKILL what is left."""
        if self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=grace_s)


@dataclass
class RunningWorker(RunningProcess):
    spec: WorkerSpec = field(default_factory=lambda: WorkerSpec("unset"))
    system_port: int = 0
    #: How it was started, so `restart()` runs the same program on the same system port.
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    restarts: int = 0

    def restart(self) -> None:
        """Stop the process and start it again: the runtime registers a new instance id and
        the worker comes back on its base (undeclared) weights, as a restarted worker does."""
        self.stop()
        self.restarts += 1
        self.log_path = self.log_path.with_name(f"{self.log_path.stem}-r{self.restarts}.log")
        self.proc = _spawn(self.name, self.argv, self.env, self.log_path)

    @property
    def system_url(self) -> str:
        return f"http://127.0.0.1:{self.system_port}"


@dataclass
class DynamoDeployment:
    """What a test gets back: URLs, the processes and the last listener payload."""

    frontend_url: str
    listener_url: str
    frontend: RunningProcess
    workers: list[RunningWorker]
    kv_dir: Path
    frontend_env: dict[str, str]
    last_listing: dict[str, Any] | None = None

    def worker(self, component: str, namespace: str | None = None) -> RunningWorker:
        for w in self.workers:
            if w.spec.component == component and namespace in (None, w.spec.namespace):
                return w
        raise KeyError(f"no worker {namespace or '*'}/{component}")

    def listing(self, timeout: float = 60.0) -> dict[str, Any]:
        """GET /v1/rl/workers with plain httpx (independent of the client under test)."""
        response = httpx.get(f"{self.listener_url}/v1/rl/workers", timeout=timeout)
        response.raise_for_status()
        self.last_listing = response.json()
        return self.last_listing

    def diagnostics(self) -> str:
        parts = [f"--- frontend ({self.frontend.log_path}) ---", self.frontend.log_tail()]
        for w in self.workers:
            parts += [f"--- worker {w.name} ({w.log_path}) ---", w.log_tail()]
        return "\n".join(parts)


def _base_env(kv_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_SCRUBBED_PREFIXES)}
    env.pop("VIRTUAL_ENV", None)
    env.update(
        {
            "DYN_DISCOVERY_BACKEND": "file",
            "DYN_FILE_KV": str(kv_dir),
            "DYN_REQUEST_PLANE": "tcp",
            "DYN_SYSTEM_HOST": "127.0.0.1",
            "DYN_TCP_RPC_HOST": "127.0.0.1",
            "DYN_LOG": env.get("INTEROP_DYN_LOG", "info"),
            "PYTHONUNBUFFERED": "1",
            # Keep the frontend's model-card cache (~/.cache/dynamo) per test.
            "HOME": str(kv_dir.parent / "home"),
        }
    )
    return env


def _spawn(name: str, argv: Sequence[str], env: Mapping[str, str], log_path: Path) -> Any:
    log = log_path.open("wb")
    try:
        # A new session gives each process its own group, so teardown can kill children too.
        return subprocess.Popen(
            list(argv),
            env=dict(env),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=str(log_path.parent),
            start_new_session=True,
        )
    finally:
        log.close()


def _entry_settled(entry: Mapping[str, Any], specs: Sequence[WorkerSpec]) -> bool:
    """An entry is settled when it shows what its spec intends (healthy or the scripted error)."""
    spec = next(
        (
            s
            for s in specs
            if s.component == entry.get("component") and s.namespace == entry.get("namespace")
        ),
        None,
    )
    if spec is None:
        return True  # e.g. a worker the test expects the listener to filter out
    if spec.probe_error is not None:
        return entry.get("error") == spec.probe_error
    if spec.probe_reply is not None:
        return "error" not in entry
    return "error" not in entry and "system_url" in entry


@pytest.fixture(scope="session")
def dynamo_python() -> Path:
    """The .venv-dynamo interpreter; skip (locally) or fail (CI) when it is not installed."""
    if DYNAMO_PYTHON.exists() and DYNAMO_STAMP.exists():
        return DYNAMO_PYTHON
    reason = (
        f"real Dynamo 1.6.1 is not installed in {DYNAMO_VENV} "
        "(run .ci/install-dynamo; it needs pip access to PyPI)"
    )
    if _in_ci():
        pytest.fail(f"CI=true but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture
def dynamo_deployment(
    dynamo_python: Path, tmp_path: Path
) -> Iterator[Callable[..., DynamoDeployment]]:
    """Factory: `dynamo_deployment(workers=[WorkerSpec(...)], frontend_env={...}, expect=N)`.

    `expect` is the number of entries `/v1/rl/workers` must list (default: all workers); every
    listed entry of a known worker must also be settled (healthy with a system_url, or showing
    its scripted probe error). Models of generation workers must be listed in `/v1/models`.
    At most one deployment per test; everything is torn down after the test.
    """
    started: list[RunningProcess] = []
    used = False

    def start(
        workers: Sequence[WorkerSpec],
        *,
        frontend_env: Mapping[str, str] | None = None,
        expect: int | None = None,
        timeout: float = READY_TIMEOUT_S,
    ) -> DynamoDeployment:
        nonlocal used
        if used:
            raise RuntimeError("one dynamo_deployment per test (keeps the 2-core machine sane)")
        used = True
        if len(workers) > 3:
            raise ValueError("keep interop deployments to at most 3 workers")

        kv_dir = tmp_path / "file-kv"
        kv_dir.mkdir()
        (tmp_path / "home").mkdir()
        base = _base_env(kv_dir)

        running_workers: list[RunningWorker] = []
        for index, spec in enumerate(workers):
            port = free_port()
            name = f"{spec.namespace}.{spec.component}"
            argv = [
                str(dynamo_python),
                str(WORKER_PROGRAM),
                "--namespace",
                spec.namespace,
                "--component",
                spec.component,
                "--world-size",
                str(spec.world_size),
            ]
            if spec.model_name:
                # One directory per model name, as replicas of one checkpoint share a path:
                # the path is part of the model card's checksum (see write_model_dir).
                model_dir = write_model_dir(
                    tmp_path / "models" / _slug(spec.model_dir or spec.model_name)
                )
                argv += ["--model-name", spec.model_name, "--model-dir", str(model_dir)]
            if spec.probe_error is not None:
                argv += ["--probe-error", spec.probe_error]
            if spec.probe_reply is not None:
                argv += ["--probe-reply", json.dumps(spec.probe_reply)]
            for route in spec.omit_routes:
                argv += ["--omit-route", route]
            env = {**base, "DYN_SYSTEM_PORT": str(port), **spec.env}
            log_path = tmp_path / f"worker-{index}-{spec.namespace}-{spec.component}.log"
            proc = _spawn(name, argv, env, log_path)
            worker = RunningWorker(
                name, proc, log_path, spec=spec, system_port=port, argv=argv, env=env
            )
            started.append(worker)
            running_workers.append(worker)

        http_port, rl_port = free_port(), free_port()
        fe_env = {
            **base,
            "DYN_ENABLE_RL": "true",
            "DYN_RL_PORT": str(rl_port),
            # Bound a stuck probe well below our own wait so failures show up as `error`s.
            "DYN_RL_REQUEST_TIMEOUT_SECS": "10",
            **(frontend_env or {}),
        }
        fe_argv = [
            str(dynamo_python),
            "-m",
            "dynamo.frontend",
            "--http-host",
            "127.0.0.1",
            "--http-port",
            str(http_port),
            "--discovery-backend",
            "file",
            "--request-plane",
            "tcp",
        ]
        fe_log = tmp_path / "frontend.log"
        frontend = RunningProcess("frontend", _spawn("frontend", fe_argv, fe_env, fe_log), fe_log)
        started.append(frontend)

        deployment = DynamoDeployment(
            frontend_url=f"http://127.0.0.1:{http_port}",
            listener_url=f"http://127.0.0.1:{rl_port}",
            frontend=frontend,
            workers=running_workers,
            kv_dir=kv_dir,
            frontend_env={k: v for k, v in fe_env.items() if k.startswith("DYN_")},
        )
        _wait_ready(deployment, workers, len(workers) if expect is None else expect, timeout)
        return deployment

    yield start

    for proc in reversed(started):
        proc.stop()


def _wait_ready(
    deployment: DynamoDeployment, specs: Sequence[WorkerSpec], expect: int, timeout: float
) -> None:
    """Poll (bounded) until the listener lists `expect` settled entries and models are served."""
    models = {s.model_name for s in specs if s.model_name}
    deadline = time.monotonic() + timeout
    last = "nothing yet"
    with httpx.Client(timeout=15.0) as client:
        while time.monotonic() < deadline:
            for proc in [deployment.frontend, *deployment.workers]:
                if proc.proc.poll() is not None:
                    raise RuntimeError(
                        f"{proc.name} exited with {proc.proc.returncode} during start-up\n"
                        + deployment.diagnostics()
                    )
            try:
                listing = client.get(f"{deployment.listener_url}/v1/rl/workers").json()
                entries = listing.get("workers", [])
                settled = len(entries) == expect and all(_entry_settled(e, specs) for e in entries)
                served = set()
                if settled and models:
                    data = client.get(f"{deployment.frontend_url}/v1/models").json()
                    served = {m.get("id") for m in data.get("data", [])}
                if settled and models <= served:
                    deployment.last_listing = listing
                    return
                last = json.dumps(listing)[:2000]
            except (httpx.HTTPError, ValueError) as exc:
                last = f"{type(exc).__name__}: {exc}"
            time.sleep(0.5)
    raise TimeoutError(
        f"Dynamo deployment not ready after {timeout:g}s (want {expect} settled workers"
        f"{', models ' + ', '.join(sorted(models)) if models else ''}); last: {last}\n"
        + deployment.diagnostics()
    )
