"""Dynamo releases as data: what each release's RL surfaces are, as far as this client relies on
them, and what was verified against which.

A source declares the release its workers run (`Source.dynamo_release`; 1.6.1 when nobody
says: the RL listener and the admin routes report no software version, so it cannot be
detected on 1.6.1). The compatibility record of every refresh names the release and its
contract, and `differences()` is what the docs and the source page list.

Sources: 1.6.1 was run (tests/interop, CPU only); 1.7 is read from upstream's docs and code
(`../shared/DYNAMO_CONTRACT.md` §9), never run here.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

DEFAULT_RELEASE = "1.6.1"


@dataclass(frozen=True)
class ReleaseContract:
    name: str
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
    #: Distributed update: what a group-initialisation timeout means.
    group_init_timeout: str

    def rows(self) -> list[tuple[str, str]]:
        return [(f.name, getattr(self, f.name)) for f in fields(self) if f.name != "name"]


RELEASES: dict[str, ReleaseContract] = {
    "1.6.1": ReleaseContract(
        name="1.6.1",
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
        group_init_timeout="worker failure (DYN_RL_INIT_WEIGHTS_TIMEOUT_S ends the process)",
    ),
    "1.7": ReleaseContract(
        name="1.7",
        verified="read from upstream docs and code (DYNAMO_CONTRACT.md §9), not run",
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
