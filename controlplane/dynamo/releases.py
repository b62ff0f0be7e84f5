"""Dynamo releases as data: what each release's RL surfaces are, as far as this client relies on
them, and what was verified against which.

A source declares the release its workers run (`Source.dynamo_release`; 1.6.1 when nobody
says: the RL listener and the admin routes report no software version, so it cannot be
detected on 1.6.1). The compatibility record of every refresh names the release and its
contract, and `differences()` is what the docs and the source page list.

Each contract has two halves: what the client *does* (`Rules`: the admin route tables per
family, the request-body rules and the success rules the adapters in `dynamo.families` are
built from, `families.for_release`), and the surfaces in words (`rows()`, for the docs and the
source page).

Sources: 1.6.1 was run (tests/interop, CPU only); 1.7 is read from upstream's docs and code
(`../shared/DYNAMO_CONTRACT.md` §9), never run here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

DEFAULT_RELEASE = "1.6.1"

#: vLLM Python worker routes per operation (`families.base.Operation` values), contract §4:
#: bare names under `/engine/`. The same in 1.6.1 and 1.7 (1.6.1's wheel already registers
#: `set_weight_version`).
_VLLM_ROUTES = {
    "liveness": "liveness_probe",
    "pause": "pause_generation",
    "resume": "resume_generation",
    "flush_cache": "flush_cache",
    "update_from_disk": "update_weights_from_disk",
    "init_weights_group": "init_weights_update_group",
    "update_from_distributed": "update_weights_from_distributed",
    "destroy_weights_group": "destroy_weights_update_group",
    "get_weight_version": "get_weight_version",
    "set_weight_version": "set_weight_version",
    # Registered (and advertised) only with `--enable-lora`; they answer `status: success`.
    "load_lora": "load_lora",
    "swap_lora": "load_lora",
    "unload_lora": "unload_lora",
    # Advertised by 1.6.1 but always answers "not implemented": see `methods.REFUSED`.
    "update_from_tensor": "update_weights_from_tensor",
}
#: Native vLLM sidecar routes per operation, in call order (contract §5.2).
_SIDECAR_ROUTES = {
    "pause": ("control/pause_generation",),
    "resume": ("control/resume_generation",),
    "get_weight_version": ("control/get_weight_version",),
    "set_weight_version": ("update/update_weight_version",),
    "init_weights_group": ("update/init_weight_transfer_engine",),
    "update_from_distributed": (
        "update/start_weight_update",
        "update/update_weights",
        "update/finish_weight_update",
    ),
    "is_paused": ("control/is_paused",),
    "is_sleeping": ("control/is_sleeping",),
    "sleep": ("control/sleep",),
    "wake_up": ("control/wake_up",),
}
#: SGLang routes per operation (contract §6): the default native routes at the top of
#: `/engine/` (1.6.1's `_DEFAULT_NATIVE_ENGINE_ROUTES`, 1.7's PR #13951), the built-in
#: `control/*` updates, and configured routes under their method's name.
_SGLANG_ROUTES = {
    "pause": "pause_generation",
    "resume": "continue_generation",
    "flush_cache": "flush_cache",
    "update_from_disk": "control/update_weights_from_disk",
    "init_weights_group": "init_weights_update_group",
    "update_from_distributed": "control/update_weights_from_distributed",
    "destroy_weights_group": "destroy_weights_update_group",
    "get_weight_version": "get_weight_version",
    "set_weight_version": "control/update_weight_version",
    "update_from_tensor": "control/update_weights_from_tensor",
    "release_memory": "release_memory_occupation",
    "resume_memory": "resume_memory_occupation",
}

#: `Rules.vllm_version_declared`: 1.6.1 answers a boolean on every reply (a reply without
#: one is malformed); 1.7 trusts it only where `set_weight_version` is advertised, and a
#: missing field means "not tracked".
DECLARED_ON_EVERY_REPLY = "every-reply"
DECLARED_WHERE_ADVERTISED = "where-advertised"


def _frozen(table: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(table))


@dataclass(frozen=True)
class Rules:
    """What the client does for workers of a release: the adapters are built from this."""

    vllm_routes: Mapping[str, str]
    sidecar_routes: Mapping[str, tuple[str, ...]]
    sglang_routes: Mapping[str, str]
    #: SGLang routes the release no longer serves: an allowlist naming one is refused.
    sglang_gone_routes: frozenset[str]
    #: How a vLLM worker's `version_declared` is read (`DECLARED_*`).
    vllm_version_declared: str
    #: Whether the native vLLM sidecar takes `sampling_params.extra_args` in generation
    #: requests (the generation check sends none; the 1.7 simulated sidecar refuses them).
    sidecar_extra_args: bool
    #: SGLang `control/update_weights_from_disk` extra body fields: 1.7's documented disk
    #: update sends `keep_pause: true` (the engine stays paused until our resume step).
    sglang_disk_extra: Mapping[str, object] = field(default_factory=lambda: _frozen({}))


@dataclass(frozen=True)
class ReleaseContract:
    name: str
    #: What the client does (route tables, bodies, success rules); not a `rows()` surface.
    rules: Rules
    #: How this release's contract was established.
    verified: str
    #: vLLM Python worker: `get_weight_version` before any declaration.
    vllm_undeclared_version: str
    #: vLLM Python worker: when `version_declared` may be trusted.
    vllm_version_declared_rule: str
    #: vLLM Python worker: an update without `weight_version`.
    vllm_update_without_version: str
    #: Native vLLM sidecar: generation requests with `sampling_params.extra_args`.
    sidecar_extra_args: str
    #: Native vLLM sidecar: where `world_size` comes from.
    sidecar_world_size: str
    #: SGLang: where the native pause/continue and memory-occupation routes live.
    sglang_native_routes: str
    #: SGLang: `update_weight_version`'s `abort_all_requests` default.
    sglang_abort_all_requests: str
    #: SGLang: the disk update's body.
    sglang_disk_update: str
    #: Distributed update: what a group-initialisation timeout means.
    group_init_timeout: str

    def rows(self) -> list[tuple[str, str]]:
        return [
            (f.name, getattr(self, f.name)) for f in fields(self) if f.name not in ("name", "rules")
        ]


RELEASES: dict[str, ReleaseContract] = {
    "1.6.1": ReleaseContract(
        name="1.6.1",
        rules=Rules(
            vllm_routes=_frozen(_VLLM_ROUTES),
            sidecar_routes=_frozen(_SIDECAR_ROUTES),
            sglang_routes=_frozen(_SGLANG_ROUTES),
            sglang_gone_routes=frozenset(),
            vllm_version_declared=DECLARED_ON_EVERY_REPLY,
            sidecar_extra_args=True,
        ),
        verified="run: real frontend, RL listener, runtime, system servers and the native vLLM "
        "sidecar (tests/interop)",
        vllm_undeclared_version='{"version": null, "version_declared": false}',
        vllm_version_declared_rule="version_declared is a boolean on every reply",
        vllm_update_without_version="keeps the previous declaration",
        sidecar_extra_args="accepted",
        sidecar_world_size="ParallelismInfo.world_size from vLLM's gRPC metadata, or "
        "--vllm-rl-world-size when vLLM reports 0",
        sglang_native_routes="pause_generation, continue_generation, "
        "release_memory_occupation, resume_memory_occupation at the top of /engine/",
        sglang_abort_all_requests="differs between SGLang builds: always sent explicitly",
        sglang_disk_update="model_path, weight_version, flush_cache: true and an explicit "
        "abort_all_requests",
        group_init_timeout="worker failure (DYN_RL_INIT_WEIGHTS_TIMEOUT_S ends the process)",
    ),
    "1.7": ReleaseContract(
        name="1.7",
        rules=Rules(
            vllm_routes=_frozen(_VLLM_ROUTES),
            sidecar_routes=_frozen(_SIDECAR_ROUTES),
            sglang_routes=_frozen(_SGLANG_ROUTES),
            sglang_gone_routes=frozenset(
                {"control/release_memory_occupation", "control/resume_memory_occupation"}
            ),
            vllm_version_declared=DECLARED_WHERE_ADVERTISED,
            sidecar_extra_args=False,
            sglang_disk_extra=_frozen({"keep_pause": True}),
        ),
        verified="read from upstream docs and code, not run here",
        vllm_undeclared_version='{"version": null, "version_declared": false} until declared; '
        "an explicit null is a declaration",
        vllm_version_declared_rule="trusted only where set_weight_version is advertised; a "
        "missing field means not tracked, never false",
        vllm_update_without_version='answers "version": "unknown", version_declared false '
        "and keeps the previous declaration",
        sidecar_extra_args="rejected: no sampling_params.extra_args in generation requests",
        sidecar_world_size="as 1.6.1; topology or capability drift between bootstrap and "
        "start-up is rejected",
        sglang_native_routes="default routes at the top of /engine/; the duplicate "
        "control/{release,resume}_memory_occupation handlers are gone",
        sglang_abort_all_requests="aborts every in-flight request when true; default differs "
        "between builds: always sent explicitly",
        sglang_disk_update="as 1.6.1, plus keep_pause: true (the documented disk update: the "
        "engine stays paused until continue_generation)",
        group_init_timeout="worker failure: rebuild the group with a known membership, never "
        "retry against an unknown group",
    ),
}

RELEASE_CHOICES = tuple((name, name) for name in RELEASES)


def contract(name: str) -> ReleaseContract:
    """The contract of release `name` (blank = the default); ValueError names the known ones."""
    release = RELEASES.get(name or DEFAULT_RELEASE)
    if release is None:
        raise ValueError(f"unknown Dynamo release {name!r}; known: {', '.join(RELEASES)}")
    return release


def differences(a: str, b: str) -> list[tuple[str, str, str]]:
    """(surface, in a, in b) for every surface the two releases treat differently."""
    left, right = dict(contract(a).rows()), dict(contract(b).rows())
    return [(k, left[k], right[k]) for k in left if k != "verified" and left[k] != right[k]]


# -- the readback's success rule ----------------------------------------------------------------

#: How a version readback reads `version_declared`: the `declared` key of a planned
#: `get_weight_version` call (`readback_rule`; absent means required).
DECLARED_REQUIRED = "required"  # must be true (1.6.1, and every family but 1.7's vLLM)
DECLARED_TRUSTED = "trusted"  # false fails; missing is "not tracked": the version decides
DECLARED_IGNORED = "ignored"  # not trusted (no set_weight_version advertised): the version decides


def readback_rule(release: str, family: str, routes: Iterable[str]) -> str:
    """The rule for `family`'s readback under `release`, given the worker's advertised routes.
    1.7's vLLM worker: `version_declared` is trusted only where `set_weight_version` is
    advertised (DYNAMO_CONTRACT §9.2)."""
    rules = contract(release).rules
    if family == "vllm" and rules.vllm_version_declared == DECLARED_WHERE_ADVERTISED:
        return DECLARED_TRUSTED if "set_weight_version" in set(routes) else DECLARED_IGNORED
    return DECLARED_REQUIRED


def declared_ok(rule: str, declared: object) -> bool:
    """Whether a readback's `version_declared` passes `rule` (None: the field was missing)."""
    if rule == DECLARED_IGNORED:
        return True
    if rule == DECLARED_TRUSTED:
        return declared is not False
    return declared is True
