"""Gates, policy refreshes, their stored plans, per-worker step results and the call journal.

The journal is the truth about what was done to a worker: one row per admin or generation call
attempt. Per-worker step results summarise it for the grid and for "retry only failed or
unreached workers". Every executor write goes through a fencing-token check (see
`executor/lease.py`), so a stale executor can never append after another has taken over.
"""

from typing import Any

from django.conf import settings
from django.db import models
from django.utils import timezone

from controlplane import telemetry
from controlplane.textlimits import LABEL_CHARS, URL_CHARS


class RefreshState(models.TextChoices):
    PLANNED = "planned"
    AWAITING_APPROVAL = "awaiting_approval"
    GATING = "gating"
    RESOLVING = "resolving"
    PAUSING = "pausing"
    UPDATING = "updating"
    FLUSHING = "flushing"
    RESUMING_ENGINES = "resuming_engines"
    VERIFYING = "verifying"
    REOPENING = "reopening"
    # Closing out a held/aborted refresh: resume the engines it paused, then end.
    RELEASING = "releasing"
    # Strategies (refresh.strategy): rolling the failed canary back to the gate's old policy,
    # waiting for a canary verdict, and waiting at a pause point until a person continues.
    CANARY_ROLLBACK = "canary_rollback"
    CANARY_REVIEW = "canary_review"
    WAITING = "waiting"
    # An external update: the workers are paused and the trainer's framework applies the
    # weights itself; the refresh waits for its `applied` report (refresh/intents/external.py).
    AWAITING_APPLY = "awaiting_apply"
    # An abort asked while an executor runs: it cancels the calls in flight and confirms, moving
    # to `aborted` (or first to `releasing`, when the engines are to be resumed). The reconciler
    # hands a refresh whose executor died here to a new executor, which confirms at once.
    ABORTING = "aborting"
    SUCCEEDED = "succeeded"
    HELD = "held"
    ABORTED = "aborted"
    FAILED = "failed"
    REJECTED = "rejected"
    # Held, then replaced by a rollback refresh (`rollback_of` points back here). A state of
    # its own rather than "failed" plus a look-up of the rollback link: pages, the API's
    # `?state=` and `refresh list --state` all filter on this column, and a derived state
    # would have two truths (stored "failed", shown "rolled back") for every filter to join.
    ROLLED_BACK = "rolled_back", "Rolled back"


#: States in which an executor owns the refresh (and the reconciler watches its lease).
EXECUTING_STATES = frozenset(
    {
        RefreshState.GATING,
        RefreshState.RESOLVING,
        RefreshState.PAUSING,
        RefreshState.UPDATING,
        RefreshState.FLUSHING,
        RefreshState.RESUMING_ENGINES,
        RefreshState.VERIFYING,
        RefreshState.REOPENING,
        RefreshState.RELEASING,
        RefreshState.CANARY_ROLLBACK,
        RefreshState.ABORTING,
    }
)
#: States with no executor in which the refresh waits for a person or a trainer (between waves,
#: or for an external update's `applied` report); each has `continue`/verdict/report, abort,
#: rollback and end as its exits.
WAITING_STATES = frozenset(
    {RefreshState.WAITING, RefreshState.CANARY_REVIEW, RefreshState.AWAITING_APPLY}
)
#: States that hold the scope lock (the refresh is "active" for its scope).
ACTIVE_STATES = (
    EXECUTING_STATES | WAITING_STATES | {RefreshState.AWAITING_APPROVAL, RefreshState.HELD}
)
#: States a refresh never leaves; entering one stamps `finished_at`.
TERMINAL_STATES = frozenset(
    {
        RefreshState.SUCCEEDED,
        RefreshState.ABORTED,
        RefreshState.FAILED,
        RefreshState.REJECTED,
        RefreshState.ROLLED_BACK,
    }
)


def state_change(state: str, **fields: Any) -> dict[str, Any]:
    """The columns a move to `state` writes: the state, when it changed, `finished_at` when it
    is terminal, and `fields` (reasons, end state, flags). Actions apply it through
    `PolicyRefresh.transition`; the executor through its fenced lease (`Lease.guard`)."""
    now = timezone.now()
    change: dict[str, Any] = {"state": state, "state_changed_at": now, **fields}
    if state in TERMINAL_STATES:
        change.setdefault("finished_at", now)
    return change


class PauseMode(models.TextChoices):
    """Pause modes across families; each family accepts only its own (planning checks)."""

    #: Each family's own default (vLLM keep, sidecar abort, SGLang abort): always valid.
    AUTO = "auto", "auto (each family's default)"
    KEEP = "keep", "keep (vLLM, sidecar)"
    WAIT = "wait", "wait (vLLM, sidecar)"
    ABORT = "abort", "abort (vLLM, sidecar, SGLang)"
    RETRACT = "retract", "retract (SGLang)"
    IN_PLACE = "in_place", "in_place (SGLang)"
    RELEASE_MEMORY = "release_memory", "release KV memory (SGLang)"


class FlushPolicy(models.TextChoices):
    # Skip the flush where the family says the update already dropped the old cache.
    AUTO = "auto", "when the update does not already invalidate the cache"
    ALWAYS = "always", "always (belt and braces)"


class GateState(models.TextChoices):
    """What a gate tells trainers about one namespace (docs/integrate/gates.md)."""

    #: Every admitted worker is verified, all at one version (`verified_version`).
    OPEN = "open", "open"
    #: Admitted workers are verified at more than one version (a staged refresh's waves).
    OPEN_MIXED = "open_mixed", "open (mixed versions)"
    #: An admitted worker is not verified at the version it serves (a person forced it in).
    OPEN_FORCED = "open_forced", "open (forced)"
    #: Refreshing, held, drifted or awaiting approval; `reason` and `active_refresh` say which.
    CLOSED = "closed", "closed"
    #: The source is stale (its listener failed or is too old): nobody knows; do not assume open.
    UNKNOWN = "unknown", "unknown"
    #: Nothing was ever verified here (never refreshed): not open, whatever the workers say.
    UNVERIFIED = "unverified", "unverified"


class Closure(models.TextChoices):
    """What closed a closed gate (`Gate.closure`, `gates.close_gate`)."""

    REFRESH = "refresh", "a policy refresh"
    DRIFT = "drift", "drift"
    #: The admitted workers are too far behind the trainer's latest policy (a `max_lag` rule).
    STALE_POLICY = "stale_policy", "stale policy"


#: States in which rollouts are admitted.
ADMITTING_STATES = frozenset({GateState.OPEN, GateState.OPEN_MIXED, GateState.OPEN_FORCED})

#: States the serving ledger decides (`gates.project`): a gate neither closed nor unknown.
LEDGER_STATES = frozenset({*ADMITTING_STATES, GateState.UNVERIFIED})


class Gate(models.Model):
    """Rollout admission for one namespace of one source, as trainers read it.

    A projection: `gates.project` recomputes it from the serving ledger (`ServingInterval`) in
    the transaction that records the facts, and nothing else writes the derived fields. Its own
    facts are the closures: `state` closed (with `reason`, `closure` naming what closed it and
    `active_refresh`; `gates.close_gate` / `gates.lift_closure` for closures that are not a
    refresh, such as `stale_policy`) or unknown (`state_before_unknown`), and a person's
    force-reopen (`forced_by`, `forced_at`, `reason`: `open_forced` until a verified opening or
    a closure). Otherwise the ledger decides `state`
    (open, open_mixed, open_forced or unverified), `verified_version`, `verified_instances`
    (the admitted instances verified at `verified_version`), `admitted` (each admitted
    instance's version and evidence) and `instance_sets`. `verified_policy` is the target of
    the refresh that last verified the namespace, which is what a rollback and a catch-up go
    back to. `revision` increments on every change so the gate API can serve it as an ETag, and
    `updated_at` moves with it; `since` moves only when `state` changes. `drift` lists the
    workers that no longer match the gate (`[{"key", "instance_id", "kind", "detail"}]`).
    Only `controlplane.refresh.gates` writes these fields.
    """

    source = models.ForeignKey("fleet.Source", on_delete=models.CASCADE, related_name="gates")
    namespace = models.CharField(max_length=200)
    state = models.CharField(max_length=16, choices=GateState.choices, default=GateState.UNVERIFIED)
    #: The state to return to when a stale source recovers (set while `state` is unknown).
    state_before_unknown = models.CharField(
        max_length=16, choices=GateState.choices, blank=True, default=""
    )
    since = models.DateTimeField(default=timezone.now)
    reason = models.TextField(blank=True)
    #: What closed a closed gate: `refresh`, `drift`, `stale_policy`, ... (`gates.close_gate`).
    closure = models.CharField(max_length=32, blank=True)
    #: Derived from the ledger: the instances the gate takes in, with their version, evidence
    #: and admission. Shape: `list[AdmittedEntry]` (refresh/gates.py).
    admitted = models.JSONField(default=list, blank=True)
    forced_by = models.CharField(max_length=200, blank=True)
    forced_at = models.DateTimeField(null=True, blank=True)
    #: Shape: `WeightVersion` (controlplane/jsontypes.py).
    verified_version = models.JSONField(null=True, blank=True)
    #: Shape: `Target` (refresh/targets.py).
    verified_policy = models.JSONField(null=True, blank=True)
    #: Shape: `InstanceIds` (controlplane/jsontypes.py).
    verified_instances = models.JSONField(default=list, blank=True)
    confirmed_at = models.DateTimeField(null=True, blank=True)
    unverified_count = models.PositiveIntegerField(default=0)
    #: Shape: `list[DriftEntry]` (refresh/gates.py).
    drift = models.JSONField(default=list, blank=True)
    #: While a staged refresh (waves, canary) runs: which instances are on which version;
    #: empty otherwise. Shape: `InstanceSets` (refresh/gates.py).
    instance_sets = models.JSONField(default=dict, blank=True)
    active_refresh = models.ForeignKey(
        "PolicyRefresh", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    revision = models.PositiveBigIntegerField(default=1)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["source", "namespace"]
        constraints = [
            models.UniqueConstraint(fields=["source", "namespace"], name="gate_unique_scope")
        ]

    def __str__(self) -> str:
        return f"{self.source.name}/{self.namespace} ({self.state})"

    @property
    def is_open(self) -> bool:
        """Rollouts are admitted (verified or forced); `state` says which."""
        return self.state in ADMITTING_STATES


class PolicyRefresh(models.Model):
    """One gated fleet update of a scope (a source's namespaces) to one target policy.

    `target` is `{"weight_version": V, "method": "disk", "model_path": P}` or
    `{"weight_version": V, "method": "distributed", "group": {...}, "update": {...}}`.
    `verification` is `{"liveness": bool, "version_readback": bool, "generation": bool,
    "prompt_token_ids": [...], "max_tokens": n, "expected_model": str, "agreement": {"kind",
    "tokens", "epsilon"}}`; the agreement rule is the source's at plan time.
    The lease fields belong to the executor; `lease_token` is the fencing token.
    """

    source = models.ForeignKey(
        "fleet.Source", on_delete=models.PROTECT, related_name="policy_refreshes"
    )
    #: Shape: `Namespaces` (controlplane/jsontypes.py).
    namespaces = models.JSONField(default=list)
    #: Shape: `WorkerKeys` (controlplane/jsontypes.py).
    worker_keys = models.JSONField(null=True, blank=True, help_text="subset; null = all")
    #: Shape: `Target` (refresh/targets.py).
    target = models.JSONField()
    pause_mode = models.CharField(max_length=16, choices=PauseMode.choices, default="auto")
    #: Per-family overrides of `pause_mode` (`{"sglang": "retract"}`).
    #: Shape: `PauseModes` (refresh/targets.py).
    pause_modes = models.JSONField(default=dict, blank=True)
    #: The plan declares that requests in flight may continue on the new weights (a pause mode
    #: that keeps them needs it); the serving ledger marks the windows it verifies as mixed.
    inflight_may_straddle = models.BooleanField(default=False)
    flush_policy = models.CharField(max_length=16, choices=FlushPolicy.choices, default="auto")
    #: Shape: `Verification` (refresh/planning/verification.py).
    verification = models.JSONField(default=dict)
    #: The trainer's statement of what the new policy generates (`dynamo.fingerprint.
    #: Fingerprint.to_dict()`); null when none was given. Every worker is verified against it.
    #: Shape: `FingerprintJson` (dynamo/fingerprint.py).
    fingerprint = models.JSONField(null=True, blank=True)

    state = models.CharField(
        max_length=24, choices=RefreshState.choices, default=RefreshState.PLANNED, db_index=True
    )
    #: Shape: `Blockers` (controlplane/jsontypes.py).
    plan_blockers = models.JSONField(default=list, blank=True)
    #: Shape: `WorkerKeys` (controlplane/jsontypes.py).
    plan_membership = models.JSONField(default=list, blank=True)
    discovery_run = models.ForeignKey(
        "fleet.DiscoveryRun", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    failed_step = models.CharField(max_length=24, blank=True)
    held_reason = models.TextField(blank=True)
    end_reason = models.TextField(blank=True)
    # After a release (abort with resume, force-reopen) the executor ends in this state.
    end_state = models.CharField(max_length=24, blank=True)
    abort_requested = models.BooleanField(default=False)
    #: What the last membership check that held found, by name (who left, joined or
    #: changed); empty when it passed. Shape: `MembershipChange` (refresh/membership.py).
    membership_change = models.JSONField(default=dict, blank=True)
    #: Listed workers a person chose to leave out of the verified set (joiners, changed ones):
    #: the reopen does not count them as a membership change; the gate counts them unverified.
    #: Shape: `WorkerKeys` (controlplane/jsontypes.py).
    left_out = models.JSONField(default=list, blank=True)
    #: Namespaces closed out one by one while the rest of the refresh goes on (`refresh.
    #: namespaces`): how, by whom, when and why. Shape: `ResolvedNamespaces`
    #: (refresh/namespaces.py).
    resolved_namespaces = models.JSONField(default=dict, blank=True)
    #: Distributed only: the group's rank map (`planning.group_plan`) and the trainer
    #: handshake (`refresh.handshake`). Shape: `Group` (refresh/handshake.py).
    group = models.JSONField(default=dict, blank=True)
    #: The compatibility record (`refresh.compat`): versions as reported, families, topology,
    #: update method and the verification that ran.
    #: Shape: `CompatRecord` (refresh/compat_record.py).
    compat = models.JSONField(default=dict, blank=True)
    #: The strategy's JSON form (`refresh.strategy.Strategy.to_dict()`); empty = all at once.
    #: Shape: `StrategyJson` (refresh/strategy.py).
    strategy = models.JSONField(default=dict, blank=True)
    #: Only these instance ids of the scope are refreshed; the rest keep serving (null = all).
    #: Shape: `InstanceIds` (controlplane/jsontypes.py).
    instances = models.JSONField(null=True, blank=True)
    #: The wave being run (from 1) and how many the plan has.
    wave = models.PositiveIntegerField(default=1)
    waves = models.PositiveIntegerField(default=1)
    #: What a staged refresh remembers between waves: the gate's policy before it
    #: (`previous_policy`, `previous_version`), a requested pause (`pause_requested`), the
    #: wave it waits after (`waiting_after`), the canary's evaluation (`canary`) and an
    #: external update's wait (`external`). Shape: `Progress` (refresh/progress.py).
    progress = models.JSONField(default=dict, blank=True)

    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    requested_by_label = models.CharField(max_length=LABEL_CHARS, blank=True)
    approved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    approved_at = models.DateTimeField(null=True, blank=True)
    rollback_of = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="rollbacks"
    )

    #: W3C `traceparent` of the refresh's root span (controlplane/telemetry.py): every later run
    #: (retry, takeover) joins that trace. Empty with tracing off.
    trace_context = models.CharField(max_length=128, blank=True, default="")

    lease_token = models.PositiveBigIntegerField(default=0)
    lease_owner = models.CharField(max_length=LABEL_CHARS, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)

    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    state_changed_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["source", "state"], name="refresh_source_state_idx")]

    def __str__(self) -> str:
        return f"policy refresh #{self.pk} ({self.state})"

    @property
    def correlation_id(self) -> str:
        return f"policy-refresh-{self.pk}"

    @property
    def trace_id(self) -> str:
        return telemetry.trace_id_of(self.trace_context)

    @property
    def trace_url(self) -> str:
        """The trace in the operator's trace viewer (`TRACE_URL_TEMPLATE`), or ""."""
        template = settings.TRACE_URL_TEMPLATE
        return template.replace("{trace_id}", self.trace_id) if template and self.trace_id else ""

    @property
    def weight_version(self):
        return self.target.get("weight_version")

    @property
    def is_active(self) -> bool:
        return self.state in ACTIVE_STATES

    def transition(self, state: str, **fields: Any) -> None:
        """Move to `state` with `fields`, stamping its times, and save only those columns.

        The caller holds this row (`intents.base.locked_refresh`, level 2 of
        `controlplane/lockorder.py`) and audits the move afterwards: the audit chain head is
        always taken last. The first move into an active state (start, a rollback taking over)
        stamps `started_at`.
        """
        change = state_change(state, **fields)
        if self.started_at is None and state in ACTIVE_STATES:
            change["started_at"] = change["state_changed_at"]
        for name, value in change.items():
            setattr(self, name, value)
        self.save(update_fields=list(change))


class ScopeLock(models.Model):
    """The database's guarantee of one active refresh per (source, namespace).

    A refresh inserts one row per namespace when it starts; the unique constraint makes a
    concurrent second start fail, and the rows go away when the refresh ends.
    """

    source = models.ForeignKey("fleet.Source", on_delete=models.CASCADE, related_name="+")
    namespace = models.CharField(max_length=200)
    refresh = models.ForeignKey(PolicyRefresh, on_delete=models.CASCADE, related_name="locks")
    acquired_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["source", "namespace"], name="scope_lock_unique")
        ]

    def __str__(self) -> str:
        return f"{self.source_id}/{self.namespace} held by #{self.refresh_id}"


class PlannedWorker(models.Model):
    """One worker in a stored plan: its family, each step's exact calls, and what blocks it.

    `calls` maps step name → list of `{"operation", "method", "path", "body"}`; a `generation`
    entry's path is relative to the source's frontend. `flush_skipped` carries the reason the
    family gives when its update already invalidates the cache.
    """

    refresh = models.ForeignKey(PolicyRefresh, on_delete=models.CASCADE, related_name="workers")
    worker = models.ForeignKey(
        "fleet.Worker", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    key = models.CharField(max_length=700)
    namespace = models.CharField(max_length=200)
    instance_id = models.CharField(max_length=20)
    system_url = models.CharField(max_length=500, blank=True)
    family = models.CharField(max_length=32, blank=True)
    model = models.CharField(max_length=300, blank=True)
    #: Shape: `PlannedCalls` (refresh/planning/worker.py).
    calls = models.JSONField(default=dict)
    #: Shape: `Blockers` (controlplane/jsontypes.py).
    blockers = models.JSONField(default=list, blank=True)
    flush_skipped = models.TextField(blank=True)
    #: The update method this worker gets and why (`dynamo.families.methods.negotiate`).
    update_method = models.CharField(max_length=16, blank=True)
    method_reason = models.TextField(blank=True)
    #: The pause mode this worker's family is sent (after `auto` and per-family mapping).
    pause_mode = models.CharField(max_length=16, blank=True)
    #: Distributed only: its first rank in the group and how many ranks it holds.
    rank_offset = models.PositiveIntegerField(null=True, blank=True)
    ranks = models.PositiveIntegerField(null=True, blank=True)
    #: Its `world_size` at plan time and where that came from (`world_size_from`, empty when
    #: unreported): optional listener metadata, never a rank map. A distributed update checks
    #: it again before the group forms; a change is topology drift and holds the refresh.
    world_size = models.PositiveBigIntegerField(null=True, blank=True)
    world_size_from = models.CharField(max_length=200, blank=True)
    #: The wave (from 1) this worker is refreshed in (`refresh.strategy.assign_waves`).
    wave = models.PositiveIntegerField(default=1)

    class Meta:
        ordering = ["namespace", "key"]
        constraints = [
            models.UniqueConstraint(fields=["refresh", "key"], name="planned_worker_unique")
        ]

    def __str__(self) -> str:
        return self.key


class StepRun(models.Model):
    """One attempt at one step of a refresh (fleet-wide), with its outcome."""

    refresh = models.ForeignKey(PolicyRefresh, on_delete=models.CASCADE, related_name="steps")
    name = models.CharField(max_length=24)
    attempt = models.PositiveIntegerField(default=1)
    #: The wave this attempt ran for (staged strategies run the worker steps once per wave).
    wave = models.PositiveIntegerField(default=1)
    # running|ok|failed|skipped|aborted (its calls were cancelled by an abort)
    status = models.CharField(max_length=16, default="running")
    detail = models.TextField(blank=True)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    duration_ms = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"#{self.refresh_id} {self.name} attempt {self.attempt}: {self.status}"


class WorkerStepResult(models.Model):
    """The outcome of one step on one worker for one attempt (latest attempt wins)."""

    refresh = models.ForeignKey(PolicyRefresh, on_delete=models.CASCADE, related_name="results")
    planned_worker = models.ForeignKey(PlannedWorker, on_delete=models.CASCADE, related_name="+")
    step = models.CharField(max_length=24)
    attempt = models.PositiveIntegerField(default=1)
    status = models.CharField(max_length=16)  # ok|failed|skipped|unreached|cancelled
    error = models.TextField(blank=True)
    duration_ms = models.FloatField(default=0)
    finished_at = models.DateTimeField()

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["refresh", "step"], name="wsr_refresh_step_idx")]

    def __str__(self) -> str:
        return f"{self.planned_worker_id} {self.step}: {self.status}"


class JournalEntry(models.Model):
    """One admin or generation call attempt: what was sent, what came back, how long it took."""

    refresh = models.ForeignKey(PolicyRefresh, on_delete=models.CASCADE, related_name="journal")
    planned_worker = models.ForeignKey(
        PlannedWorker, null=True, blank=True, on_delete=models.CASCADE, related_name="journal"
    )
    step = models.CharField(max_length=24)
    operation = models.CharField(max_length=32)
    method = models.CharField(max_length=8)
    url = models.CharField(max_length=URL_CHARS)
    #: Shape: `OpaqueJson` (controlplane/jsontypes.py): as sent.
    request_body = models.JSONField(null=True, blank=True)
    http_status = models.PositiveSmallIntegerField(null=True, blank=True)
    #: Shape: `OpaqueJson` (controlplane/jsontypes.py): as the worker answered.
    response_body = models.JSONField(null=True, blank=True)
    ok = models.BooleanField()
    error = models.TextField(blank=True)
    duration_ms = models.FloatField()
    attempt = models.PositiveIntegerField(default=1)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField()
    lease_token = models.PositiveBigIntegerField()
    #: An abort cancelled the call before its reply (`ok` is false, `error` says so).
    cancelled = models.BooleanField(default=False, db_default=False)
    #: For a cancelled call: whether any byte of the request had been written to the worker's
    #: connection (then the worker may have received it and acted; otherwise it cannot have
    #: seen it). Null for a call that was not cancelled (docs/operate/abort.md).
    reached = models.BooleanField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        verbose_name_plural = "journal entries"

    def __str__(self) -> str:
        outcome = "cancelled" if self.cancelled else ("ok" if self.ok else "failed")
        return f"#{self.refresh_id} {self.step} {self.operation} {outcome}"


class QuarantineState(models.TextChoices):
    """Where one drifted worker's catch-up stands (docs/concepts/drift.md)."""

    #: Paused and out of the verified set; its catch-up is queued.
    QUARANTINED = "quarantined"
    #: Being updated to the gate's verified policy and verified, alone.
    CATCHING_UP = "catching_up"
    #: Verified at the gate's version, resumed and back in the verified set.
    ADMITTED = "admitted"
    #: Catch-up (or the pause) failed: it stays paused and out of the set, with its reason.
    FAILED = "failed"
    #: A person resumed it without admitting it: it serves, outside the verified set.
    RELEASED = "released"
    #: It left the fleet; nothing more to do.
    DROPPED = "dropped"
    #: A policy refresh planned the worker and took it over (`executor/handover.py`): the
    #: refresh brings it to its own target, so catching up to the older policy would undo it.
    SUPERSEDED = "superseded"


#: States in which the quarantine row, not drift detection, owns the instance.
OPEN_QUARANTINE_STATES = frozenset(
    {
        QuarantineState.QUARANTINED,
        QuarantineState.CATCHING_UP,
        QuarantineState.FAILED,
        QuarantineState.RELEASED,
    }
)
#: States in which the worker is held paused by the control plane.
HELD_QUARANTINE_STATES = frozenset(
    {QuarantineState.QUARANTINED, QuarantineState.CATCHING_UP, QuarantineState.FAILED}
)


class Quarantine(models.Model):
    """One drifted worker, paused and caught up alone to its gate's verified policy.

    A small sequence of its own rather than a one-worker PolicyRefresh: the refresh's scope lock,
    gate closing and lease belong to a whole scope, while a catch-up must leave the gate open
    for everyone else. `target` is the gate's `verified_policy` when the drift was found;
    `QuarantineCall` rows journal every admin and generation call made for it.
    """

    source = models.ForeignKey("fleet.Source", on_delete=models.CASCADE, related_name="+")
    namespace = models.CharField(max_length=200)
    instance_id = models.CharField(max_length=20)
    key = models.CharField(max_length=700)
    worker = models.ForeignKey(
        "fleet.Worker", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    #: joined | version | recovered (the drift kinds of `refresh.drift`).
    kind = models.CharField(max_length=16)
    detail = models.TextField(blank=True)
    state = models.CharField(
        max_length=16, choices=QuarantineState.choices, default=QuarantineState.QUARANTINED
    )
    reason = models.TextField(blank=True)
    paused = models.BooleanField(default=False)
    attempts = models.PositiveIntegerField(default=0)
    #: Shape: `Target` (refresh/targets.py).
    target = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)
    #: Touched every few seconds by the runner of a catch-up (`quarantine.Heartbeat`); a
    #: `catching_up` row whose heartbeat went silent lost its Celery worker and is re-queued by
    #: the reconciler (`reconcile.requeue_stalled_quarantines`).
    heartbeat_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["source", "namespace", "instance_id"],
                condition=models.Q(state__in=["quarantined", "catching_up", "failed", "released"]),
                name="quarantine_one_open_per_instance",
            )
        ]

    def __str__(self) -> str:
        return f"quarantine #{self.pk} {self.key} ({self.state})"

    @property
    def correlation_id(self) -> str:
        return f"quarantine-{self.pk}"

    @property
    def is_open(self) -> bool:
        return self.state in OPEN_QUARANTINE_STATES


class QuarantineCall(models.Model):
    """One admin or generation call made for a quarantined worker (its journal)."""

    quarantine = models.ForeignKey(Quarantine, on_delete=models.CASCADE, related_name="journal")
    step = models.CharField(max_length=24)
    attempt = models.PositiveIntegerField(default=1)
    operation = models.CharField(max_length=32)
    method = models.CharField(max_length=8)
    url = models.CharField(max_length=URL_CHARS)
    #: Shape: `OpaqueJson` (controlplane/jsontypes.py): as sent.
    request_body = models.JSONField(null=True, blank=True)
    http_status = models.PositiveSmallIntegerField(null=True, blank=True)
    #: Shape: `OpaqueJson` (controlplane/jsontypes.py): as the worker answered.
    response_body = models.JSONField(null=True, blank=True)
    ok = models.BooleanField()
    error = models.TextField(blank=True)
    duration_ms = models.FloatField()
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField()

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"quarantine #{self.quarantine_id} {self.step} {self.operation}"
