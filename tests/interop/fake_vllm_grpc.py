"""A fake vLLM engine behind vLLM's native gRPC API, for Dynamo's real native vLLM sidecar.

Dynamo 1.6.1's `python -m dynamo.vllm.sidecar` (a Rust binary inside the wheel) talks to a vLLM
engine only through gRPC: `vllm.Control`, `vllm.Inference` and `grpc.health.v1.Health`. This
module serves those three from the test process, so the sidecar under test is the real one and
only the engine behind it is scripted. The protos (`programs/vllm_grpc/*.proto`) are compiled
with grpcio-tools at first use into a temporary directory, never committed as generated code.

The engine keeps a log of every RPC (name + request as a dict) and can be told to fail one RPC
with a gRPC status, which is how the tests reach the sidecar's real error shapes.
"""

from __future__ import annotations

import importlib
import json
import sys
import tempfile
import threading
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from tests.interop.programs.synthetic_model import EOS_ID, policy_tokens

PROTO_DIR = Path(__file__).resolve().parent / "programs" / "vllm_grpc"
_compiled: dict[str, ModuleType] = {}
_compile_lock = threading.Lock()


def _protos() -> dict[str, ModuleType]:
    """Compile control.proto and inference.proto once per process and import the stubs."""
    with _compile_lock:
        if _compiled:
            return _compiled
        from grpc_tools import protoc  # imported lazily: only interop tests need it

        out = Path(tempfile.mkdtemp(prefix="vllm-grpc-stubs-"))
        for name in ("control.proto", "inference.proto"):
            argv = [
                "protoc",
                f"-I{PROTO_DIR}",
                f"--python_out={out}",
                f"--grpc_python_out={out}",
                str(PROTO_DIR / name),
            ]
            if protoc.main(argv) != 0:
                raise RuntimeError(f"protoc failed on {name}")
        sys.path.insert(0, str(out))
        try:
            for mod in ("control_pb2", "control_pb2_grpc", "inference_pb2", "inference_pb2_grpc"):
                _compiled[mod] = importlib.import_module(mod)
        finally:
            sys.path.remove(str(out))
        return _compiled


PAUSE_MODES = {0: "unspecified", 1: "abort", 2: "wait", 3: "keep"}


@dataclass
class FakeVllmEngine:
    """What the fake engine holds and how it answers; tests read and script it directly."""

    model_id: str
    served_model_name: str
    tensor_parallel_size: int = 2
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    #: 0 means "omitted from gRPC metadata" (vLLM releases before it was added).
    world_size: int = 2
    weight_transfer_backend: str = "nccl"
    weight_version: str = ""
    paused: bool = False
    in_update: bool = False
    transfer_initialised: bool = False
    #: RPC name -> (grpc.StatusCode, message): the next calls of that RPC fail so.
    failures: dict[str, tuple[grpc.StatusCode, str]] = field(default_factory=dict)
    log: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def calls(self, name: str | None = None) -> list[tuple[str, dict[str, Any]]]:
        with self.lock:
            return [c for c in self.log if name is None or c[0] == name]

    def _enter(self, name: str, request: Any, context: grpc.ServicerContext) -> None:
        body = MessageToDict(request, preserving_proto_field_name=True)
        with self.lock:
            self.log.append((name, body))
            failure = self.failures.get(name)
        if failure is not None:
            context.abort(*failure)


def _control_servicer(engine: FakeVllmEngine, pb: ModuleType, base: type) -> Any:
    class Control(base):  # type: ignore[misc, valid-type]
        def GetServerInfo(self, request, context):
            engine._enter("GetServerInfo", request, context)
            return pb.ServerInfo(
                engine_version="0.0.0-fake",
                api_version="vllm",  # the sidecar refuses any other Control API version
                instance_id="fake-engine",
                parallelism=pb.ParallelismInfo(
                    tensor_parallel_size=engine.tensor_parallel_size,
                    pipeline_parallel_size=engine.pipeline_parallel_size,
                    data_parallel_size=engine.data_parallel_size,
                    data_parallel_size_local=engine.data_parallel_size,
                    world_size=engine.world_size,
                ),
                max_model_len=4096,
                kv_block_size=16,
                total_kv_blocks=1024,
                max_running_requests=64,
                max_batched_tokens=2048,
                max_loras=0,
                rl_capabilities=pb.RlCapabilities(
                    weight_transfer_enabled=True,
                    weight_transfer_backend=engine.weight_transfer_backend,
                ),
            )

        def GetModelInfo(self, request, context):
            engine._enter("GetModelInfo", request, context)
            return pb.ModelInfo(
                model_id=engine.model_id,
                served_model_name=engine.served_model_name,
                supports_text_input=True,
                supports_token_ids_input=True,
            )

        def Abort(self, request, context):
            engine._enter("Abort", request, context)
            return pb.AbortResponse()

        def ListLoras(self, request, context):
            engine._enter("ListLoras", request, context)
            return pb.ListLorasResponse()

        def GetKvEventSources(self, request, context):
            engine._enter("GetKvEventSources", request, context)
            return pb.GetKvEventSourcesResponse()

        def PauseGeneration(self, request, context):
            engine._enter("PauseGeneration", request, context)
            with engine.lock:
                engine.paused = True
            return pb.PauseGenerationResponse()

        def ResumeGeneration(self, request, context):
            engine._enter("ResumeGeneration", request, context)
            with engine.lock:
                engine.paused = False
            return pb.ResumeGenerationResponse()

        def IsPaused(self, request, context):
            engine._enter("IsPaused", request, context)
            return pb.IsPausedResponse(paused=engine.paused)

        def InitWeightTransferEngine(self, request, context):
            engine._enter("InitWeightTransferEngine", request, context)
            json.loads(request.init_info_json or b"{}")
            with engine.lock:
                engine.transfer_initialised = True
            return pb.InitWeightTransferEngineResponse()

        def StartWeightUpdate(self, request, context):
            engine._enter("StartWeightUpdate", request, context)
            # vLLM refuses a weight update while generation runs.
            if not engine.paused:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, "engine is not paused")
            with engine.lock:
                engine.in_update = True
            return pb.StartWeightUpdateResponse()

        def UpdateWeights(self, request, context):
            engine._enter("UpdateWeights", request, context)
            if not engine.in_update:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, "no weight update started")
            return pb.UpdateWeightsResponse()

        def FinishWeightUpdate(self, request, context):
            engine._enter("FinishWeightUpdate", request, context)
            with engine.lock:
                engine.in_update = False
                if request.HasField("weight_version"):
                    engine.weight_version = request.weight_version
            return pb.FinishWeightUpdateResponse()

        def UpdateWeightVersion(self, request, context):
            engine._enter("UpdateWeightVersion", request, context)
            with engine.lock:
                engine.weight_version = request.weight_version
            return pb.UpdateWeightVersionResponse()

        def GetWeightVersion(self, request, context):
            engine._enter("GetWeightVersion", request, context)
            return pb.GetWeightVersionResponse(weight_version=engine.weight_version)

    return Control()


def _inference_servicer(engine: FakeVllmEngine, pb: ModuleType, base: type) -> Any:
    class Inference(base):  # type: ignore[misc, valid-type]
        def _tokens(self, request) -> list[int]:
            prompt = list(request.token_ids.ids) if request.HasField("token_ids") else []
            count = request.stopping.max_new_tokens or 4
            return policy_tokens(engine.weight_version or None, prompt, count)

        def GenerateStream(self, request, context):
            engine._enter("GenerateStream", request, context)
            ids = self._tokens(request)
            prompt_len = len(request.token_ids.ids) if request.HasField("token_ids") else 0
            for i, tok in enumerate(ids):
                last = i == len(ids) - 1
                out = pb.SequenceOutput(index=0, num_tokens=1, token_ids=[tok], text=f" w{tok}")
                if last:
                    out.finish_info.CopyFrom(
                        pb.FinishInfo(
                            num_output_tokens=len(ids),
                            finish_reason=pb.FinishInfo.LENGTH,
                        )
                    )
                response = pb.GenerateResponse(outputs=out)
                if i == 0:
                    response.prompt_info.CopyFrom(pb.PromptInfo(num_prompt_tokens=prompt_len))
                yield response

        def Generate(self, request, context):
            engine._enter("Generate", request, context)
            ids = self._tokens(request)
            return pb.GenerateResponse(
                outputs=pb.SequenceOutput(
                    num_tokens=len(ids),
                    token_ids=ids,
                    finish_info=pb.FinishInfo(
                        num_output_tokens=len(ids), finish_reason=pb.FinishInfo.LENGTH
                    ),
                )
            )

    _ = EOS_ID  # the synthetic vocabulary's EOS is never emitted: every reply ends on length
    return Inference()


@dataclass
class FakeVllmServer:
    engine: FakeVllmEngine
    server: grpc.Server
    port: int

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.stop(grace=None)


def serve(engine: FakeVllmEngine, port: int) -> FakeVllmServer:
    """Serve Control, Inference and grpc health (SERVING) on 127.0.0.1:`port`."""
    stubs = _protos()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    stubs["control_pb2_grpc"].add_ControlServicer_to_server(
        _control_servicer(engine, stubs["control_pb2"], stubs["control_pb2_grpc"].ControlServicer),
        server,
    )
    stubs["inference_pb2_grpc"].add_InferenceServicer_to_server(
        _inference_servicer(
            engine, stubs["inference_pb2"], stubs["inference_pb2_grpc"].InferenceServicer
        ),
        server,
    )
    health_servicer = health.HealthServicer()
    for service in ("", "vllm.Control", "vllm.Inference"):
        health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    if bound != port:
        raise RuntimeError(f"could not bind the fake vLLM gRPC server to port {port}")
    server.start()
    return FakeVllmServer(engine=engine, server=server, port=port)
