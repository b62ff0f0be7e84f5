"""The compatibility record of a policy refresh: what ran against what.

The integration checklist asks that "the tested versions, environment, and topology are
recorded". One record per refresh, stored with it (`PolicyRefresh.compat`), shown on its page
and exported with the API: the versions as reported, the families, the topology (namespaces,
world sizes, ranks), the update method, and the verification that ran.

Dynamo 1.6.1 reports no software version on its RL listener or admin routes, and backends
report none either; so versions are recorded as the requester declared them (`declared`), and
as `null` where nobody did — never guessed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any, TypedDict

from django.utils import timezone

from controlplane.dynamo.fingerprint import AgreementRuleJson
from controlplane.dynamo.releases import contract
from controlplane.jsontypes import WeightVersion
from controlplane.refresh.handshake import Group
from controlplane.refresh.targets import Target


class DeclaredVersions(TypedDict):
    """What the requester declared (`normalize_versions`), and what Dynamo reported: never
    anything in 1.6.1, so null, with the note saying so."""

    declared: dict[str, str]
    dynamo_reported: str | None
    note: str


#: The Dynamo release the plan's client contract is (`release_record`); `from` is a keyword.
ReleaseRecord = TypedDict("ReleaseRecord", {"release": str, "from": str, "contract": str})


class SourceRecord(TypedDict):
    name: str
    listener_url: str


class DiscoveryRecord(TypedDict):
    """The discovery the plan was made from (None and "" when there was none)."""

    run_id: int | None
    reported_namespace: str
    workers_live: int | None


class Topology(TypedDict):
    namespaces: list[str]
    workers: int
    #: world size (as text, or "unreported") → how many workers report it, and from where.
    worker_world_sizes: dict[str, int]
    worker_world_size_from: dict[str, int]
    group_world_size: int | None
    trainer_ranks: int | None


class PlannedChecks(TypedDict):
    version_readback: bool
    liveness: bool
    generation: bool
    agreement: AgreementRuleJson | None


class VerificationRan(TypedDict):
    """What the verify step did (`verification_ran`)."""

    ok: bool
    detail: str
    at: str
    weight_version: WeightVersion


class VerificationRecord(TypedDict):
    planned: PlannedChecks
    #: None until the verify step has run.
    ran: VerificationRan | None


class CompatRecord(TypedDict):
    """`PolicyRefresh.compat` (`compat_at_plan`, then `ran` once verify did); this module owns
    its keys."""

    versions: DeclaredVersions
    dynamo_release: ReleaseRecord
    source: SourceRecord
    discovery: DiscoveryRecord
    #: family → how many planned workers have it; update method → how many get it.
    families: dict[str, int]
    topology: Topology
    update_method: str
    methods: dict[str, int]
    verification: VerificationRecord


#: Version keys a requester may declare (`versions` in the plan request).
VERSION_KEYS = ("dynamo", "vllm", "sglang", "trtllm", "trainer")


def normalize_versions(raw: Any) -> dict[str, str]:
    """Declared versions: short strings under known keys; raises ValueError otherwise."""
    if raw in (None, {}):
        return {}
    if not isinstance(raw, dict):
        raise ValueError("versions must be an object")
    unknown = sorted(set(raw) - set(VERSION_KEYS))
    if unknown:
        raise ValueError(f"unknown version keys {unknown}; use {', '.join(VERSION_KEYS)}")
    clean = {}
    for key, value in raw.items():
        if not isinstance(value, str) or not value.strip() or len(value) > 100:
            raise ValueError(f"version of {key} must be a short non-empty string")
        clean[key] = value.strip()
    return clean


def release_record(source) -> ReleaseRecord:
    """The Dynamo release the plan's client contract is, and where that comes from."""
    declared = getattr(source, "dynamo_release", "") or ""
    release = contract(declared)
    return {
        "release": release.name,
        "from": "declared on the source" if declared else "default (not declared)",
        "contract": release.verified,
    }


def world_size_provenance(worker, family: str) -> str:
    """Where a worker's `world_size` comes from, in words ("" when it reports none). It is
    optional producer-supplied metadata of the listener entry (integration reference: "not a
    rank map"); the native vLLM sidecar takes it from the engine's parallelism, or from the
    operator's `--vllm-rl-world-size` when vLLM reports 0, and the listing cannot say which."""
    if not worker.world_size:
        return ""
    if family == "vllm-sidecar":
        return (
            "listener metadata: the sidecar's engine parallelism (ParallelismInfo.world_size) "
            "or the operator's --vllm-rl-world-size"
        )
    return "listener metadata: the worker's own rl descriptor"


def compat_at_plan(
    source,
    target: Target,
    verification: Mapping[str, Any],
    plans,
    group: Group,
    run,
    versions: dict[str, str] | None = None,
) -> CompatRecord:
    """The record as planned; `record_verification` adds what verification actually did."""
    families = Counter(p.family for p in plans if p.family)
    world_sizes = Counter(str(p.worker.world_size or "unreported") for p in plans)
    world_size_from = Counter(
        world_size_provenance(p.worker, p.family) or "unreported" for p in plans
    )
    return {
        "versions": {
            "declared": dict(versions or {}),
            "dynamo_reported": None,
            "note": "Dynamo 1.6.1 reports no software version on /v1/rl/workers or the "
            "admin routes",
        },
        "dynamo_release": release_record(source),
        "source": {"name": source.name, "listener_url": source.listener_url},
        "discovery": {
            "run_id": run.pk if run is not None else None,
            "reported_namespace": run.reported_namespace if run is not None else "",
            "workers_live": run.workers_live if run is not None else None,
        },
        "families": dict(sorted(families.items())),
        "topology": {
            "namespaces": sorted({p.worker.namespace for p in plans}),
            "workers": len(plans),
            "worker_world_sizes": dict(sorted(world_sizes.items())),
            # Optional listener metadata, a count and never a rank map (the plan's `ranks` is).
            "worker_world_size_from": dict(sorted(world_size_from.items())),
            "group_world_size": group.get("world_size"),
            "trainer_ranks": group.get("trainer_ranks"),
        },
        "update_method": target["method"],
        "methods": dict(sorted(Counter(p.update_method for p in plans).items())),
        "verification": {
            "planned": {
                "version_readback": bool(verification.get("version_readback")),
                "liveness": bool(verification.get("liveness")),
                "generation": bool(verification.get("generation")),
                "agreement": verification.get("agreement"),
            },
            "ran": None,
        },
    }


def verification_ran(refresh, detail: str, ok: bool) -> VerificationRan:
    """What the verify step did, to store under `compat.verification.ran`."""
    return {
        "ok": ok,
        "detail": detail[:1000],
        "at": timezone.now().isoformat(),
        "weight_version": refresh.weight_version,
    }
