"""The events a trainer sends, and the endpoint rules that decide whether approval is needed."""

from __future__ import annotations

from typing import Annotated, Any, TypedDict

from pydantic import BaseModel, ConfigDict, Field, StrictBool, model_validator

from controlplane.intake.fingerprint import FingerprintIn

CHECKPOINT_READY = "checkpoint.ready"
TEST_PING = "test.ping"
#: The trainer broadcast a distributed refresh's weights (after `refresh.group_ready`).
BROADCAST_DONE = "broadcast.done"
#: The trainer's verdict on a canary (after `refresh.canary_review`).
CANARY_VERDICT = "canary.verdict"
#: The trainer published a checkpoint (step, version, digest), refresh or not.
POLICY_PUBLISHED = "policy.published"
#: The trainer's framework applied an external refresh's weights (after
#: `refresh.ready_for_apply`).
REFRESH_APPLIED = "refresh.applied"
EVENT_TYPES = (
    CHECKPOINT_READY,
    TEST_PING,
    BROADCAST_DONE,
    CANARY_VERDICT,
    POLICY_PUBLISHED,
    REFRESH_APPLIED,
)


class BroadcastDone(BaseModel):
    """`POST /api/v1/refreshes/<id>/broadcast_done`, as a signed webhook."""

    model_config = ConfigDict(extra="forbid")

    refresh_id: int = Field(ge=1, le=2**63 - 1, description="the refresh whose group is ready")
    weight_version: str | int | None = Field(
        None, description="the version broadcast; refused when it is not the refresh's"
    )
    attempt: int | None = Field(
        None,
        ge=1,
        le=2**31 - 1,
        description="the handshake attempt broadcast to (`group.attempt` in "
        "`refresh.group_ready`); a report for an earlier attempt is refused (409). Needed "
        "once the group was formed again (attempt 2 on)",
    )


class RefreshEvent(BaseModel):
    """An event about one policy refresh, named by `refresh_id` (`refresh_event.py` finds it)."""

    model_config = ConfigDict(extra="forbid")

    refresh_id: int = Field(ge=1, le=2**63 - 1)


class CanaryVerdict(RefreshEvent):
    """`POST /api/v1/refreshes/<id>/canary_verdict`, as a signed webhook: the trainer evaluated
    the canary's verified instances (named in `refresh.canary_review`) and answers."""

    model_config = ConfigDict(extra="forbid")

    refresh_id: int = Field(ge=1, le=2**63 - 1, description="the refresh whose canary waits")
    weight_version: str | int = Field(
        description="the version the trainer evaluated; refused when it is not the refresh's"
    )
    passed: StrictBool = Field(description="true: the rest of the scope follows; false: roll back")
    metrics: dict[str, Any] = Field(
        default_factory=dict, description="what the evaluation measured (kept and audited)"
    )
    reason: str = Field("", max_length=2000, description="optional; shown with a failure")


class Applied(RefreshEvent):
    """`POST /api/v1/refreshes/<id>/applied`, as a signed webhook: the trainer's framework
    applied the new weights itself to the workers `refresh.ready_for_apply` named."""

    model_config = ConfigDict(extra="forbid")

    refresh_id: int = Field(ge=1, le=2**63 - 1, description="the refresh waiting in awaiting_apply")
    weight_version: str | int = Field(
        description="the version applied; refused (409) when it is not the refresh's"
    )
    instance_ids: list[Annotated[str, Field(pattern=r"^\d{1,20}$")]] | None = Field(
        None,
        max_length=10000,
        description="the announced workers it applied to (decimal instance ids); omitted: all",
    )


class ExternalUpdate(BaseModel):
    """The trainer's framework applies the weights itself (`external`)."""

    model_config = ConfigDict(extra="forbid")

    apply_timeout_s: float | None = Field(
        None,
        gt=0,
        le=86400,
        description="how long the paused workers wait for the applied report before the "
        "refresh holds (default: the server's REFRESH_APPLY_TIMEOUT_SECONDS)",
    )


class DistributedUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    group: dict[str, Any] = Field(description="init_weights_update_group parameters")
    update: dict[str, Any] = Field(description="update_weights_from_distributed parameters")


class CheckpointReady(BaseModel):
    """A new policy checkpoint: where to load it from and what version it is."""

    model_config = ConfigDict(extra="forbid")

    weight_version: str | int = Field(description="version workers must report after the update")
    model_path: str | None = Field(None, max_length=1000, description="for a disk update")
    distributed: DistributedUpdate | None = Field(None, description="for a distributed update")
    external: ExternalUpdate | None = Field(
        None,
        description="for an external update: the trainer applies the weights itself after "
        "`refresh.ready_for_apply` and reports `refresh.applied`",
    )
    step: int | None = Field(None, ge=0, description="training step of the checkpoint")
    metrics: dict[str, float] = Field(default_factory=dict)
    checkpoint_digest: str | None = Field(None, max_length=200)
    namespaces: list[str] | None = Field(
        None, description="a subset of the endpoint's namespaces; default all of them"
    )
    fingerprint: FingerprintIn | None = Field(
        None, description="what the new policy generates; every worker is verified against it"
    )
    strategy: dict[str, Any] | None = Field(
        None,
        description="how to walk the scope (the API's strategy object); only when the endpoint "
        "allows overrides, otherwise 403. Omitted: the endpoint's default strategy, then the "
        "source's",
    )

    @model_validator(mode="after")
    def _one_method(self):
        given = [self.model_path, self.distributed, self.external]
        if sum(value is not None for value in given) != 1:
            raise ValueError("give exactly one of model_path, distributed or external")
        if isinstance(self.weight_version, str) and not self.weight_version.strip():
            raise ValueError("weight_version must not be empty")
        return self

    def fingerprint_dict(self) -> dict[str, Any] | None:
        return self.fingerprint.as_dict() if self.fingerprint is not None else None

    def target(self) -> dict[str, Any]:
        if self.external is not None:
            target: dict[str, Any] = {"weight_version": self.weight_version, "method": "external"}
            if self.external.apply_timeout_s is not None:
                target["apply_timeout_s"] = self.external.apply_timeout_s
            return target
        if self.distributed is not None:
            return {
                "weight_version": self.weight_version,
                "method": "distributed",
                "group": self.distributed.group,
                "update": self.distributed.update,
            }
        return {
            "weight_version": self.weight_version,
            "method": "disk",
            "model_path": self.model_path,
        }


_OPS = {
    "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b,
    "gt": lambda a, b: a > b,
    "ge": lambda a, b: a >= b,
}
RULE_OPS = tuple(_OPS)


class WebhookResponse(TypedDict, total=False):
    """`ReceivedWebhook.response`: the answer a delivery got, kept to answer a repeat of its
    webhook id (the `WebhookResult` schema of the trainer webhook). This module owns its keys;
    `group`, `canary`, `external` and `published` are the views those events answer with."""

    status: str
    webhook_id: str
    delivery_id: int | None
    state: str | None
    outcome: str
    refresh_id: int | None
    attempts: int | None
    last_error: str | None
    detail: str | None
    queued: bool | None
    recovery: str | None
    group: dict[str, Any] | None
    canary: dict[str, Any] | None
    external: dict[str, Any] | None
    created: bool | None
    published: dict[str, Any] | None


class ApprovalRule(TypedDict):
    """One of `WebhookEndpoint.rules` (`validate_rules`): a checkpoint whose `metric` is `op`
    `value` needs a person's approval. This module owns its keys."""

    metric: str
    #: One of `RULE_OPS`.
    op: str
    value: float


def validate_rules(rules: Any) -> list[ApprovalRule]:
    """Rules look like `{"metric": "eval/reward", "op": "lt", "value": 0.2}`. Raises ValueError."""
    if not isinstance(rules, list):
        raise ValueError("rules must be a list")
    clean: list[ApprovalRule] = []
    for rule in rules:
        if not isinstance(rule, dict) or set(rule) != {"metric", "op", "value"}:
            raise ValueError("each rule needs exactly metric, op and value")
        if rule["op"] not in _OPS:
            raise ValueError(f"op must be one of {', '.join(RULE_OPS)}")
        if not isinstance(rule["metric"], str) or not rule["metric"]:
            raise ValueError("metric must be a name")
        if isinstance(rule["value"], bool) or not isinstance(rule["value"], int | float):
            raise ValueError("value must be a number")
        clean.append(ApprovalRule(metric=rule["metric"], op=rule["op"], value=float(rule["value"])))
    return clean


def approval_reasons(rules: list[dict[str, Any]], metrics: dict[str, float]) -> list[str]:
    """Why the rules want a person to approve. A metric a rule needs but the event lacks counts
    as a reason too: a rule that cannot be checked must not wave the checkpoint through."""
    reasons = []
    for rule in rules:
        name, op, value = rule["metric"], rule["op"], rule["value"]
        if name not in metrics:
            reasons.append(f"metric {name} missing (rule {op} {value:g})")
        elif _OPS[op](metrics[name], value):
            reasons.append(f"{name} = {metrics[name]:g} is {op} {value:g}")
    return reasons
