"""Planning a policy refresh: what each worker will be asked, and what blocks the plan.

- `verification`: the verification switches, agreement rule and trainer fingerprint, validated.
- `worker`: one worker's plan, built by ordered passes that each return their blockers.
- `group`: the plan-wide judgements: the source's outbound policy and a distributed group.
- `scope`: which workers a plan covers, by ordered passes that each return their blockers.

Pure with respect to the network: planning judges the Worker rows a fresh discovery just wrote
(`intents.plan.plan_policy_refresh` runs it). Modules inside this package import each other by
submodule, never through this face.
"""

from controlplane.refresh.planning.group import (
    assign_ranks,
    group_plan,
    plan_level_blockers,
    source_policy,
)
from controlplane.refresh.planning.scope import SCOPE_PASSES, Scope, ScopeRequest, select_scope
from controlplane.refresh.planning.verification import (
    DEFAULT_VERIFICATION,
    GENERATION,
    agreement_rule_of,
    generation_check_from_call,
    generation_tokens,
    normalize_fingerprint,
    normalize_verification,
)
from controlplane.refresh.planning.worker import (
    GROUP_DESTROY,
    GROUP_INIT,
    WORKER_PASSES,
    WorkerPlan,
    plan_worker,
    update_is_idempotent,
    update_operation,
)
from controlplane.refresh.targets import (
    AUTO,
    PAUSE_MODE_CHOICES,
    RANK_KEYS,
    normalize_pause_modes,
    normalize_target,
)

__all__ = [
    "AUTO",
    "DEFAULT_VERIFICATION",
    "GENERATION",
    "GROUP_DESTROY",
    "GROUP_INIT",
    "PAUSE_MODE_CHOICES",
    "RANK_KEYS",
    "SCOPE_PASSES",
    "WORKER_PASSES",
    "Scope",
    "ScopeRequest",
    "WorkerPlan",
    "agreement_rule_of",
    "assign_ranks",
    "generation_check_from_call",
    "generation_tokens",
    "group_plan",
    "normalize_fingerprint",
    "normalize_pause_modes",
    "normalize_target",
    "normalize_verification",
    "plan_level_blockers",
    "plan_worker",
    "select_scope",
    "source_policy",
    "update_is_idempotent",
    "update_operation",
]
