"""What a refresh is asked to do, validated: the target policy (per update method) and the
pause modes per family. Bad input raises ValidationError with a message a person can act on,
before anything is planned or called.

This module owns the keys of the target policy: `Target` is `PolicyRefresh.target`, and the
same policy where it is kept again (`Gate.verified_policy`, `Quarantine.target`, a drill's
`current_policy` and `previous_policy`); `PauseModes` is `PolicyRefresh.pause_modes`."""

from __future__ import annotations

from typing import Any, Required, TypedDict

from django.conf import settings
from django.core.exceptions import ValidationError

from controlplane.dynamo.families import FAMILIES, AdminFamily, LoraAction, Operation, UpdateMethod
from controlplane.jsontypes import Empty, OpaqueJson, WeightVersion

#: Keys the planner assigns per worker in a distributed group: a trainer never gives them.
RANK_KEYS = ("rank_offset", "world_size", "rank")
#: Sidecar-only update keys (`update/update_weights` bodies); the other families never see them.
SIDECAR_UPDATE_KEYS = ("update_infos", "update_info")
#: The pause method that frees SGLang's KV cache memory instead of only pausing
#: (docs/concepts/update-methods.md).
RELEASE_MEMORY = "release_memory"
AUTO = "auto"


class LoraTarget(TypedDict, total=False):
    """A LoRA update's adapter: load, unload or swap `lora_name` (from `uri` unless unload)."""

    action: Required[str]
    lora_name: Required[str]
    uri: str


class Target(TypedDict, total=False):
    """A target policy, normalized (`normalize_target`): the version and method, then the keys
    of that method only."""

    weight_version: Required[WeightVersion]
    #: An `UpdateMethod`: disk, distributed, lora, tensor, external or custom.
    method: Required[str]
    #: disk: the checkpoint path the engines load.
    model_path: str
    #: distributed: the trainer's group parameters (master address and port, backend, ...) and
    #: update fields, passed to the engines as given; its ranks and the two timeouts (seconds).
    group: dict[str, OpaqueJson]
    update: dict[str, OpaqueJson]
    trainer_ranks: int
    init_timeout_s: float
    broadcast_timeout_s: float
    #: lora: the adapter.
    lora: LoraTarget
    #: external: how long the refresh waits for the trainer's `applied` report (seconds).
    apply_timeout_s: float
    #: custom: the relative engine route and the body sent to it as given.
    route: str
    body: dict[str, OpaqueJson]


#: `DrillRun.current_policy` and `previous_policy`: the two policies a drill moves between, or
#: `{}` for a scheduled drill refused before it began (`drills/runner.record_refused`).
DrillPolicy = Target | Empty


#: `PolicyRefresh.pause_modes`: family name → its pause mode (`{"sglang": "retract"}`).
PauseModes = dict[str, str]


def _positive(target: dict[str, Any], name: str, default: float) -> float:
    value = target.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ValidationError(f"{name} must be a positive number of seconds")
    return float(value)


def _normalize_distributed(target: dict[str, Any], base: Target) -> Target:
    group = target.get("group") or {}
    update = target.get("update") or {}
    if not isinstance(group, dict) or not isinstance(update, dict):
        raise ValidationError("distributed group and update parameters must be objects")
    if set(group) == {"init_info"} and isinstance(group["init_info"], dict):
        group = dict(group["init_info"])  # the sidecar's wrapping; bodies are made per family
    given = sorted(k for k in RANK_KEYS if k in group)
    if given:
        raise ValidationError(
            f"distributed group must not give {', '.join(given)}: ranks are assigned per "
            "worker from its world_size (the plan shows the rank map)"
        )
    for key in ("master_address", "master_port"):
        if group.get(key) in (None, ""):
            raise ValidationError(f"distributed group needs {key}")
    trainer_ranks = target.get("trainer_ranks", 1)
    if isinstance(trainer_ranks, bool) or not isinstance(trainer_ranks, int) or trainer_ranks < 1:
        raise ValidationError("trainer_ranks must be a whole number of at least 1")
    return {
        **base,
        "group": group,
        "update": update,
        "trainer_ranks": trainer_ranks,
        # Below the workers' DYN_RL_INIT_WEIGHTS_TIMEOUT_S watchdog (default 30 s): the value a
        # trainer gives here must be the workers' setting, never above it.
        "init_timeout_s": _positive(
            target, "init_timeout_s", settings.REFRESH_GROUP_INIT_TIMEOUT_SECONDS
        ),
        "broadcast_timeout_s": _positive(
            target, "broadcast_timeout_s", settings.REFRESH_BROADCAST_TIMEOUT_SECONDS
        ),
    }


def normalize_target(target: dict[str, Any]) -> Target:
    """Validate a target policy; raises ValidationError with a message a person can act on."""
    if not isinstance(target, dict):
        raise ValidationError("target must be an object")
    version = target.get("weight_version")
    if version in (None, ""):
        raise ValidationError("target needs a weight_version")
    method = target.get("method", "disk")
    base = Target(weight_version=version, method=method)
    if method == UpdateMethod.DISK:
        path = target.get("model_path")
        if not isinstance(path, str) or not path.strip():
            raise ValidationError("a disk update needs a model_path")
        return {**base, "model_path": path.strip()}
    if method == UpdateMethod.DISTRIBUTED:
        return _normalize_distributed(target, base)
    if method == UpdateMethod.LORA:
        lora = target.get("lora")
        if not isinstance(lora, dict):
            raise ValidationError("a LoRA update needs a lora object (action, lora_name, uri)")
        action = lora.get("action", "load")
        if action not in LoraAction.__members__.values():
            raise ValidationError("lora action must be load, unload or swap")
        name = lora.get("lora_name")
        if not isinstance(name, str) or not name.strip():
            raise ValidationError("a LoRA update needs a lora_name")
        clean = LoraTarget(action=action, lora_name=name.strip())
        if action != LoraAction.UNLOAD:
            uri = lora.get("uri")
            if not isinstance(uri, str) or not uri.strip():
                raise ValidationError(f"a LoRA {action} needs the adapter's source uri")
            clean["uri"] = uri.strip()
        return {**base, "lora": clean}
    if method == UpdateMethod.TENSOR:
        update = target.get("update")
        if not isinstance(update, dict) or not update:
            raise ValidationError("a tensor update needs its update fields")
        return {**base, "update": update}
    if method == UpdateMethod.EXTERNAL:
        # How long the refresh waits, its workers paused, for the trainer's `applied` report
        # before it holds (the beat task `refresh.expire_apply_waits` enforces it).
        return {
            **base,
            "apply_timeout_s": _positive(
                target, "apply_timeout_s", settings.REFRESH_APPLY_TIMEOUT_SECONDS
            ),
        }
    if method == UpdateMethod.CUSTOM:
        route = target.get("route")
        body = target.get("body") or {}
        if not isinstance(route, str) or not route.strip() or route.startswith("/"):
            raise ValidationError("a custom update needs a relative engine route")
        if not isinstance(body, dict):
            raise ValidationError("a custom update's body must be an object")
        return {**base, "route": route.strip(), "body": body}
    methods = ", ".join(m.value for m in UpdateMethod)
    raise ValidationError(f"unknown update method {method!r}; use one of {methods}")


def normalize_pause_modes(pause_mode: str, pause_modes: dict[str, Any] | None) -> PauseModes:
    """Validate the per-family pause mode mapping; raises ValidationError.

    `pause_mode` applies to every family not named in `pause_modes` (`auto`: each family's own
    default, the one that always works). A mode is checked against the family it names here,
    and against each worker's family at plan time (a blocker names the modes it has)."""
    if pause_mode not in PAUSE_MODE_CHOICES:
        raise ValidationError(f"unknown pause mode {pause_mode!r}")
    clean: PauseModes = {}
    for family_name, mode in (pause_modes or {}).items():
        family = FAMILIES.get(family_name)
        if family is None:
            raise ValidationError(f"pause_modes: unknown family {family_name!r}")
        if mode not in family_pause_modes(family):
            raise ValidationError(
                f"pause_modes: {family_name} has no pause mode {mode!r}; choose one of "
                f"{', '.join(family_pause_modes(family))}"
            )
        clean[family_name] = mode
    return clean


def family_pause_modes(family: AdminFamily) -> tuple[str, ...]:
    """The modes an operator may pick for a family: `auto`, its own, and memory release where
    the family has it."""
    memory = (RELEASE_MEMORY,) if Operation.RELEASE_MEMORY in family.routes else ()
    return (AUTO, *family.pause_modes, *memory)


#: Every mode any family has, for the form and the API schema.
PAUSE_MODE_CHOICES = tuple(
    dict.fromkeys(m for f in FAMILIES.values() for m in family_pause_modes(f))
)


#: Pause modes that keep the requests in flight: frozen (vLLM `keep`) or retracted (SGLang
#: `retract`, `in_place`), they continue after resume on the new weights, so their samples span
#: two policies. SGLang's disk update sends `abort_all_requests: true`, which drops them instead.
KEEPING_MODES = ("keep", "retract", "in_place")
#: The plan field that declares requests in flight may straddle the update.
STRADDLE_FIELD = "inflight_may_straddle"


def straddling_modes(pause_mode: str, pause_modes: dict[str, str] | None, method: str) -> list[str]:
    """The chosen pause modes under which requests in flight would continue on the new weights
    (`family: mode`, or the plan-wide mode alone), in a stable order."""
    chosen = [("", pause_mode), *sorted((pause_modes or {}).items())]
    out: list[str] = []
    for family, mode in chosen:
        if mode not in KEEPING_MODES:
            continue
        if mode != "keep" and method == UpdateMethod.DISK:
            continue  # SGLang's disk update aborts what was retracted (abort_all_requests)
        out.append(f"{family}: {mode}" if family else mode)
    return out


def check_straddle(
    pause_mode: str, pause_modes: dict[str, str] | None, method: str, declared: bool
) -> None:
    """A pause mode that keeps requests in flight is refused unless the plan declares that they
    may straddle the update; ValidationError keyed by the declaration's field."""
    if declared:
        return
    modes = straddling_modes(pause_mode, pause_modes, method)
    if modes:
        raise ValidationError(
            {
                STRADDLE_FIELD: (
                    f"pause mode {', '.join(modes)} keeps the requests in flight across the "
                    "update: they continue on the new weights, so their samples span two "
                    f"policies. Declare {STRADDLE_FIELD} to allow it (the serving ledger then "
                    "marks the window as mixed), or choose wait or abort."
                )
            }
        )
