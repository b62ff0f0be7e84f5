"""Our client against Dynamo 1.6.1's REAL native vLLM sidecar (`python -m dynamo.vllm.sidecar`).

The sidecar is the Rust binary inside the ai-dynamo wheel. It runs unmodified, with file
discovery and the TCP request plane, next to the real frontend and its RL listener. The only
scripted part is the vLLM engine behind it: `fake_vllm_grpc` serves vLLM's native gRPC
`vllm.Control`, `vllm.Inference` and grpc health from the test process, and logs every RPC the
sidecar makes, so each test can say which engine call our admin call turned into.

What this pins down (docs/reference/dynamo-releases.md lists it as verified on 1.6.1):

- discovery: `world_size` comes from the engine's parallelism metadata, `admin_base_url` from
  `--vllm-http-endpoint`; the route list is `control/*` + `update/*`;
- `control/pause_generation` unregisters the worker's `generate` endpoint from discovery (the
  frontend's `/health` stops listing it) and `control/resume_generation` registers it again;
- the disk-less update lifecycle init_weight_transfer_engine → start → update → finish, the
  version readback, and the exact gRPC calls each became;
- the real error shapes: HTTP 200 `{"status":"error"}` for a refused pause mode, HTTP 500
  `{"error":"Handler error"}` for an engine failure, both read as failures by our families;
- a pause whose engine call fails leaves the worker unregistered (the sidecar unregisters
  first and does not re-register on failure), so the refresh must resume it explicitly.

Why not the SGLang sidecar: see `test_sglang_sidecar_cannot_be_served_the_same_way` below.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import pytest

from controlplane.dynamo.admin import call_admin
from controlplane.dynamo.discovery import DiscoveredWorker, fetch_discovery
from controlplane.dynamo.families import VLLM_SIDECAR, detect_family
from controlplane.dynamo.families.base import AdminCall, Operation
from controlplane.dynamo.http import make_client
from controlplane.dynamo.policy import OutboundPolicy
from tests.interop.conftest import (
    DYNAMO_PYTHON,
    READY_TIMEOUT_S,
    RunningProcess,
    _base_env,
    _spawn,
    free_port,
)
from tests.interop.programs.synthetic_model import write_model_dir

pytestmark = pytest.mark.interop

grpc_tools = pytest.importorskip("grpc_tools", reason="grpcio-tools is in the dev extras")
from tests.interop.fake_vllm_grpc import FakeVllmEngine, FakeVllmServer, serve  # noqa: E402

LOOPBACK = OutboundPolicy.from_cidrs(["127.0.0.0/8"])
TIMEOUT = 20.0
#: Where the sidecar says vLLM's own HTTP server is; only advertised, never called here.
VLLM_HTTP = "http://127.0.0.1:9/"


@dataclass
class SidecarDeployment:
    engine: FakeVllmEngine
    grpc_server: FakeVllmServer
    sidecar: RunningProcess
    frontend: RunningProcess
    system_url: str
    frontend_url: str
    listener_url: str

    def generate_registered(self) -> bool:
        """Whether the frontend's /health lists this worker's `generate` endpoint instance."""
        body = httpx.get(f"{self.frontend_url}/health", timeout=TIMEOUT).json()
        return any(i.get("endpoint") == "generate" for i in body.get("instances", []))

    def wait_registered(self, want: bool) -> None:
        """Discovery changes reach the frontend through its file watch: poll, bounded."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.generate_registered() is want:
                return
            time.sleep(0.25)
        raise AssertionError(f"generate endpoint registered={not want} after {READY_TIMEOUT_S}s")

    def diagnostics(self) -> str:
        return "\n".join(
            [
                f"--- sidecar ({self.sidecar.log_path}) ---",
                self.sidecar.log_tail(),
                f"--- frontend ({self.frontend.log_path}) ---",
                self.frontend.log_tail(),
            ]
        )


@pytest.fixture
def sidecar_deployment(dynamo_python: Path, tmp_path: Path) -> Iterator[SidecarDeployment]:
    kv_dir = tmp_path / "file-kv"
    kv_dir.mkdir()
    (tmp_path / "home").mkdir()
    base = _base_env(kv_dir)
    model_dir = write_model_dir(tmp_path / "models" / "tiny-policy")
    # TP 2 x PP 1 x DP 1: the engine reports world_size 2 in its parallelism metadata.
    engine = FakeVllmEngine(model_id=str(model_dir), served_model_name="tiny-policy")
    server = serve(engine, free_port())
    system_port, http_port, rl_port = free_port(), free_port(), free_port()
    started: list[RunningProcess] = []
    try:
        sidecar_log = tmp_path / "sidecar.log"
        sidecar = RunningProcess(
            "sidecar",
            _spawn(
                "sidecar",
                [
                    str(DYNAMO_PYTHON),
                    "-m",
                    "dynamo.vllm.sidecar",
                    "--enable-rl",
                    "--grpc-endpoint",
                    server.endpoint,
                    "--namespace",
                    "dynamo",
                    "--component",
                    "backend",
                    "--vllm-http-endpoint",
                    VLLM_HTTP,
                ],
                {**base, "DYN_SYSTEM_PORT": str(system_port)},
                sidecar_log,
            ),
            sidecar_log,
        )
        started.append(sidecar)
        fe_log = tmp_path / "frontend.log"
        fe_env = {
            **base,
            "DYN_ENABLE_RL": "true",
            "DYN_RL_PORT": str(rl_port),
            "DYN_RL_REQUEST_TIMEOUT_SECS": "10",
        }
        fe_argv = [
            str(DYNAMO_PYTHON),
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
        frontend = RunningProcess("frontend", _spawn("frontend", fe_argv, fe_env, fe_log), fe_log)
        started.append(frontend)
        dep = SidecarDeployment(
            engine=engine,
            grpc_server=server,
            sidecar=sidecar,
            frontend=frontend,
            system_url=f"http://127.0.0.1:{system_port}",
            frontend_url=f"http://127.0.0.1:{http_port}",
            listener_url=f"http://127.0.0.1:{rl_port}",
        )
        _wait_listed(dep)
        yield dep
    finally:
        for proc in reversed(started):
            proc.stop()
        server.stop()


def _wait_listed(dep: SidecarDeployment) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    last = "nothing yet"
    while time.monotonic() < deadline:
        for proc in (dep.sidecar, dep.frontend):
            if proc.proc.poll() is not None:
                raise RuntimeError(f"{proc.name} exited during start-up\n" + dep.diagnostics())
        with contextlib.suppress(httpx.HTTPError, ValueError):
            workers = httpx.get(f"{dep.listener_url}/v1/rl/workers", timeout=TIMEOUT).json()
            last = str(workers)[:500]
            ready = [w for w in workers.get("workers", []) if "system_url" in w]
            if ready and dep.generate_registered():
                return
        time.sleep(0.5)
    raise TimeoutError(f"sidecar not listed: {last}\n" + dep.diagnostics())


async def discover(dep: SidecarDeployment) -> DiscoveredWorker:
    async with make_client(timeout=TIMEOUT) as client:
        result = await fetch_discovery(client, LOOPBACK, dep.listener_url, timeout=TIMEOUT)
    [worker] = result.workers
    return worker


async def run(dep: SidecarDeployment, op: Operation, **params):
    """Every call of one family operation, in order; stops at the first failure."""
    results = []
    async with make_client(timeout=TIMEOUT) as client:
        for call in VLLM_SIDECAR.build(op, **params):
            result = await call_admin(
                client, LOOPBACK, dep.system_url, VLLM_SIDECAR, call, timeout=TIMEOUT
            )
            results.append(result)
            if not result.ok:
                break
    return results


def engine_calls(dep: SidecarDeployment, since: int) -> list[str]:
    return [name for name, _ in dep.engine.calls()[since:]]


async def test_discovery_of_the_real_sidecar(sidecar_deployment):
    dep = sidecar_deployment
    worker = await discover(dep)

    assert worker.identity.namespace == "dynamo"
    assert worker.identity.component == "backend"
    assert worker.system_url == dep.system_url
    # From the engine's ParallelismInfo.world_size (TP 2 x PP 1 x DP 1), not a rank map.
    assert worker.world_size == 2
    assert worker.admin_base_url == VLLM_HTTP
    assert worker.model == "tiny-policy"
    assert set(worker.routes) >= {
        "control/pause_generation",
        "control/resume_generation",
        "control/get_weight_version",
        "update/init_weight_transfer_engine",
        "update/start_weight_update",
        "update/update_weights",
        "update/finish_weight_update",
        "update/update_weight_version",
    }
    assert all(r.startswith(("control/", "update/")) for r in worker.routes)
    assert detect_family(worker.routes) is VLLM_SIDECAR


async def test_full_diskless_update_lifecycle_through_the_real_sidecar(sidecar_deployment):
    dep = sidecar_deployment
    assert dep.generate_registered()
    before = len(dep.engine.calls())

    [paused] = await run(dep, Operation.PAUSE, mode="wait")
    assert paused.ok, paused.error
    # The sidecar unregisters the generate endpoint before it pauses the engine.
    dep.wait_registered(False)
    assert dep.engine.calls()[before:][-1] == (
        "PauseGeneration",
        {"mode": "PAUSE_MODE_WAIT", "clear_cache": True},
    )

    [init] = await run(dep, Operation.INIT_WEIGHTS_GROUP, init_info={"master_port": 29500})
    assert init.ok, init.error
    update = await run(
        dep,
        Operation.UPDATE_FROM_DISTRIBUTED,
        update_infos=[{"names": ["w.0"]}, {"names": ["w.1"]}],
        weight_version="policy-7",
    )
    assert [r.ok for r in update] == [True, True, True, True], [r.error for r in update]
    assert engine_calls(dep, before) == [
        "PauseGeneration",
        "InitWeightTransferEngine",
        "StartWeightUpdate",
        "UpdateWeights",
        "UpdateWeights",
        "FinishWeightUpdate",
    ]
    assert dep.engine.calls("FinishWeightUpdate")[-1][1] == {"weight_version": "policy-7"}

    [version] = await run(dep, Operation.GET_WEIGHT_VERSION)
    assert version.ok
    assert (version.data["version"], version.data["version_declared"]) == ("policy-7", True)

    [resumed] = await run(dep, Operation.RESUME)
    assert resumed.ok, resumed.error
    dep.wait_registered(True)
    assert dep.engine.paused is False
    [state] = await run(dep, Operation.IS_PAUSED)
    assert state.ok and state.data["is_paused"] is False


async def test_real_error_shapes_are_failures(sidecar_deployment):
    dep = sidecar_deployment
    async with make_client(timeout=TIMEOUT) as client:
        # HTTP 200 with status "error": a pause mode the sidecar refuses. Our adapter never
        # builds one, so the call is made by hand.
        bogus = AdminCall(
            Operation.PAUSE, "POST", "engine/control/pause_generation", {"mode": "bogus"}
        )
        refused = await call_admin(
            client, LOOPBACK, dep.system_url, VLLM_SIDECAR, bogus, timeout=TIMEOUT
        )
    assert refused.http_status == 200
    assert not refused.ok
    assert "pause_generation mode must be abort, wait, or keep" in (refused.error or "")
    assert dep.engine.calls("PauseGeneration") == []
    assert dep.generate_registered()

    # HTTP 500 "Handler error": the engine fails the RPC.
    dep.engine.failures["StartWeightUpdate"] = (grpc.StatusCode.INTERNAL, "nccl group is gone")
    [started] = await run(dep, Operation.UPDATE_FROM_DISTRIBUTED, update_infos=[{"n": 1}])
    assert started.http_status == 500
    assert not started.ok
    assert started.error.startswith("HTTP 500: Handler error: ")
    assert "nccl group is gone" in started.error
    # A sidecar update without its body is also a 500, and the engine is never called.
    async with make_client(timeout=TIMEOUT) as client:
        empty = AdminCall(
            Operation.UPDATE_FROM_DISTRIBUTED, "POST", "engine/update/update_weights", {}
        )
        missing = await call_admin(
            client, LOOPBACK, dep.system_url, VLLM_SIDECAR, empty, timeout=TIMEOUT
        )
    assert (missing.http_status, missing.ok) == (500, False)
    assert "missing `update_info` JSON object" in (missing.error or "")
    assert dep.engine.calls("UpdateWeights") == []


async def test_failed_pause_leaves_the_worker_unregistered(sidecar_deployment):
    dep = sidecar_deployment
    dep.engine.failures["PauseGeneration"] = (grpc.StatusCode.INTERNAL, "engine core died")

    [paused] = await run(dep, Operation.PAUSE, mode="wait")
    assert (paused.http_status, paused.ok) == (500, False)
    assert "engine core died" in (paused.error or "")
    # The sidecar unregistered first and leaves the endpoint out on failure: the worker takes
    # no traffic although the engine never paused. Only an explicit resume brings it back.
    dep.wait_registered(False)
    assert dep.engine.paused is False

    del dep.engine.failures["PauseGeneration"]
    [resumed] = await run(dep, Operation.RESUME)
    assert resumed.ok, resumed.error
    dep.wait_registered(True)


def test_sglang_sidecar_has_no_rl_control_over_grpc(dynamo_python: Path):
    """Why there is no SGLang counterpart of the tests above.

    1.6.1's `dynamo.sglang.sidecar` does take `--grpc-endpoint`, but the gRPC service it calls,
    `sglang.runtime.v1.SglangService`, carries only Generate, Abort, HealthCheck, GetModelInfo,
    GetServerInfo and ListModels: no pause, resume, flush or weight-update RPC exists for a fake
    engine to answer, so its RL admin routes cannot be driven through gRPC the way the vLLM
    sidecar's are. Start-up also needs SGLang's `dist_init_addr` rendezvous in
    GetServerInfo's `json_info`. The method table is read from the compiled binary (the
    paths tonic embeds), so if a release adds control RPCs this fails and the gap must be
    closed with a fake SGLang engine."""
    import mmap
    import re

    site = next((dynamo_python.parent.parent / "lib").glob("python3*/site-packages"))
    with (
        (site / "dynamo" / "_core.abi3.so").open("rb") as fh,
        mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as blob,
    ):
        sglang = b"/sglang.runtime.v1.SglangService/"
        present = {
            n
            for n in ("Generate", "GetServerInfo", "GetModelInfo", "HealthCheck")
            if blob.find(sglang + n.encode()) != -1
        }
        control = re.findall(
            rb"/sglang\.runtime\.v1\.SglangService/(?:Pause|Resume|Continue|Update|Flush|Release)\w*",
            blob,
        )
        # The same scan finds the vLLM sidecar's control RPCs, so the method is sound.
        vllm_pause = blob.find(b"/vllm.Control/PauseGeneration") != -1
    assert present == {"Generate", "GetServerInfo", "GetModelInfo", "HealthCheck"}
    assert control == []
    assert vllm_pause
