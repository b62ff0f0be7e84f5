"""Operator intents on policy refreshes and gates: one function each (README "What is where").

Each writes its change and its audit rows in one transaction and enqueues the executor on
commit; views, the JSON API, webhooks and the management commands call these and never write
refresh models themselves.

- `base`: the kit the intents share (locked refresh, audit row, scope conflict, enqueue).
- `plan`: plan a refresh. `lifecycle`: start, approve, reject, abort, discard, retry, end.
- `recovery`: roll back, force a gate or namespace open, accept membership, reopen.
- `queries`: what pages and intents ask without changing anything.
- `canary`, `pausepoints`, `expiry`: the canary verdict, pause points, plan and review expiry.
- `action_table`: every operator action as one row (permission, inputs, wording).

Modules inside this package import each other by submodule, never through this face.
"""

from controlplane.refresh.intents.base import EXECUTE_TASK
from controlplane.refresh.intents.lifecycle import (
    abort_policy_refresh,
    approve_policy_refresh,
    discard_policy_refresh,
    end_policy_refresh,
    reject_policy_refresh,
    retry_policy_refresh,
    start_policy_refresh,
)
from controlplane.refresh.intents.plan import plan_policy_refresh
from controlplane.refresh.intents.queries import (
    can_end,
    is_membership_hold,
    last_verified_policy,
    left_paused_keys,
    resolved_summary,
)
from controlplane.refresh.intents.recovery import (
    force_reopen_gate,
    force_reopen_namespace,
    reopen_verified_namespaces,
    resolve_membership,
    rollback_policy_refresh,
)

__all__ = [
    "EXECUTE_TASK",
    "abort_policy_refresh",
    "approve_policy_refresh",
    "can_end",
    "discard_policy_refresh",
    "end_policy_refresh",
    "force_reopen_gate",
    "force_reopen_namespace",
    "is_membership_hold",
    "last_verified_policy",
    "left_paused_keys",
    "plan_policy_refresh",
    "reject_policy_refresh",
    "reopen_verified_namespaces",
    "resolve_membership",
    "resolved_summary",
    "retry_policy_refresh",
    "rollback_policy_refresh",
    "start_policy_refresh",
]
