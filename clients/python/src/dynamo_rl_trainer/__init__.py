"""Trainer-side client for the Dynamo RL control plane.

- `ControlPlane`: announce checkpoints (signed Standard Webhooks, key rotation), wait for the
  gate, list admitted instances, report a distributed broadcast, report weights a framework
  applied itself (`external`), give a canary verdict.
- `Frontend.pinned_completion`: token-id generation through the Dynamo frontend, pinned to an
  admitted instance, with the engine's own token ids and attempt identity kept across retries.
- `admit` / `AdmissionGuard`: the sample-admission guard (Dynamo's RL integration reference).

The package's major version is the API version it speaks (`API_VERSION`, `/api/v1/`).
"""

from dynamo_rl_trainer.admission import Admission, AdmissionView, GateView, LedgerView
from dynamo_rl_trainer.control import API_PREFIX, API_VERSION, ControlPlane
from dynamo_rl_trainer.errors import (
    ApplyTimeout,
    CheckpointRefused,
    Conflict,
    ControlPlaneError,
    DuplicateAttempt,
    Forbidden,
    GateTimeout,
    GenerationError,
    NotFound,
    Throttled,
    TrainerClientError,
    Unauthorized,
    WebhookRefused,
)
from dynamo_rl_trainer.generation import Completion, Frontend, GenerationRequest
from dynamo_rl_trainer.guard import RULES, AdmissionGuard, Failure, Sample, Verdict, admit
from dynamo_rl_trainer.results import (
    AdmittedInstances,
    ApplyRequest,
    ApplyWorker,
    Delivery,
    Gate,
    GroupView,
    WebhookAnswer,
    WorkerIdentity,
)
from dynamo_rl_trainer.signing import Signer, sign

__version__ = "1.0.0"

__all__ = [
    "API_PREFIX",
    "API_VERSION",
    "RULES",
    "Admission",
    "AdmissionGuard",
    "AdmissionView",
    "AdmittedInstances",
    "ApplyRequest",
    "ApplyTimeout",
    "ApplyWorker",
    "CheckpointRefused",
    "Completion",
    "Conflict",
    "ControlPlane",
    "ControlPlaneError",
    "Delivery",
    "DuplicateAttempt",
    "Failure",
    "Forbidden",
    "Frontend",
    "Gate",
    "GateTimeout",
    "GateView",
    "GenerationError",
    "GenerationRequest",
    "GroupView",
    "LedgerView",
    "NotFound",
    "Sample",
    "Signer",
    "Throttled",
    "TrainerClientError",
    "Unauthorized",
    "Verdict",
    "WebhookAnswer",
    "WebhookRefused",
    "WorkerIdentity",
    "__version__",
    "admit",
    "sign",
]
