"""Sources, the workers discovered behind them, and what each discovery run observed."""

from datetime import datetime

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models

from controlplane.dynamo import fingerprint as fp
from controlplane.dynamo import limits
from controlplane.dynamo.discovery import worker_key
from controlplane.dynamo.families import DECLARABLE_FAMILIES
from controlplane.dynamo.releases import RELEASE_CHOICES

# Names match `controlplane.dynamo.families.FAMILIES`.
FAMILY_CHOICES = [
    ("vllm", "vLLM worker"),
    ("vllm-sidecar", "vLLM native sidecar"),
    ("sglang", "SGLang"),
]

instance_id_validator = RegexValidator(
    r"^(0|[1-9][0-9]{0,19})$", "instance_id must be an unsigned 64-bit integer"
)


class AgreementRule(models.TextChoices):
    EXACT = fp.EXACT, "exact agreement on the first k tokens"
    LOGPROB = fp.LOGPROB, "chosen-token logprobs within epsilon over the first k tokens"


class DriftPolicy(models.TextChoices):
    """What a worker that no longer matches its gate's verified policy does
    (docs/concepts/drift.md)."""

    #: Pause it at once, keep it out of the verified set, catch it up alone and admit it back.
    QUARANTINE = "quarantine", "quarantine and catch up"
    #: Close the namespace's gate, naming the drift, until an operator acts.
    CLOSE = "close", "close the gate"
    #: Record and show it; never act on it.
    OBSERVE = "observe", "observe only"


class ListenerScope(models.TextChoices):
    """The namespace scope a source declares its RL listener to have (docs/concepts/scope.md).

    Undeclared follows what the listener reports, except a global listener, which reaches
    every deployment's admin routes and so must be declared before its workers are used."""

    UNDECLARED = "", "undeclared (follow the listener; refuse a global one)"
    EXACT = "exact", "exact namespace (DYN_NAMESPACE)"
    PREFIX = "prefix", "prefix and its generations (DYN_NAMESPACE_PREFIX)"
    SUFFIX = "suffix", "suffixed pool (DYN_NAMESPACE + DYN_NAMESPACE_WORKER_SUFFIX)"
    GLOBAL = "global", "global: every namespace (DYN_NAMESPACE_PREFIX=dynamo)"


class MaxLagAction(models.TextChoices):
    """What a namespace serving a policy more than `max_lag_steps` behind the trainer's latest
    published one does (docs/concepts/policy-lag.md)."""

    #: Show the lag (gate API, pages, /metrics); never act on it.
    OBSERVE = "observe", "observe"
    #: Notify (`policy.lag_exceeded`) once per time the namespace falls behind.
    ALERT = "alert", "notify"
    #: Close the namespace's gate as `stale_policy` until a refresh brings it within bounds.
    CLOSE = "close", "close the gate"


class Source(models.Model):
    """One Dynamo deployment: its RL listener, its frontend and its admin network policy.

    The expected scope fields record what the operator believes the listener covers; the
    listener's own answer (`reported_namespace`) is shown next to it, so a misconfigured
    frontend is visible instead of silently covering the wrong namespaces.
    """

    name = models.SlugField(max_length=64, unique=True)
    listener_url = models.URLField(help_text="Dynamo RL listener base URL, e.g. http://host:8001")
    frontend_url = models.URLField(blank=True, help_text="OpenAI frontend base URL")
    expected_namespace = models.CharField(max_length=200, blank=True)
    expected_prefix = models.CharField(max_length=200, blank=True)
    expected_worker_suffix = models.CharField(max_length=200, blank=True)
    #: The declared scope: workers the listener reports outside it are refused on every
    #: discovery (`fleet.declared_scope`).
    listener_scope = models.CharField(
        max_length=16, choices=ListenerScope.choices, default=ListenerScope.UNDECLARED, blank=True
    )
    #: Shape: `Networks` (controlplane/jsontypes.py).
    allowed_networks = models.JSONField(
        default=list, help_text="CIDRs that listener, frontend and worker admin URLs must be in"
    )
    discovery_interval_seconds = models.FloatField(
        default=10.0, validators=[MinValueValidator(1.0)]
    )
    require_approval = models.BooleanField(default=False)
    enabled = models.BooleanField(default=True)

    # How the verify step decides that workers of one model agree (dynamo/fingerprint.py says
    # why greedy replicas need a rule at all): exact ids on the first `agreement_tokens`, or
    # chosen-token logprobs within `agreement_epsilon` over them.
    agreement_rule = models.CharField(
        max_length=16, choices=AgreementRule.choices, default=AgreementRule.EXACT
    )
    agreement_tokens = models.PositiveSmallIntegerField(
        default=fp.DEFAULT_AGREEMENT_TOKENS,
        validators=[MinValueValidator(1), MaxValueValidator(fp.MAX_FINGERPRINT_TOKENS)],
    )
    agreement_epsilon = models.FloatField(default=fp.DEFAULT_EPSILON)
    drift_policy = models.CharField(
        max_length=16, choices=DriftPolicy.choices, default=DriftPolicy.QUARANTINE
    )
    #: Policy lag (refresh/policy_lag.py): what happens once the admitted workers serve a
    #: policy more than `max_lag_steps` training steps behind the latest published one.
    max_lag_action = models.CharField(
        max_length=16, choices=MaxLagAction.choices, default=MaxLagAction.OBSERVE
    )
    max_lag_steps = models.PositiveIntegerField(
        default=1, help_text="training steps the served policy may be behind the latest published"
    )
    #: The refresh strategy a plan gets unless it names its own (`refresh.strategy` JSON form;
    #: empty = all at once).
    #: Shape: `StrategyJson` (refresh/strategy.py).
    default_strategy = models.JSONField(default=dict, blank=True)
    #: Hours between scheduled rollback drills (refresh.drills; docs/operate/drills.md);
    #: 0 = never. A due drill is skipped while a policy refresh is active on the source.
    drill_every = models.PositiveIntegerField(
        default=0, help_text="hours between scheduled rollback drills; 0 = never"
    )

    #: The backend family of this source's workers where their routes do not say it (native
    #: Rust sidecars of vLLM, SGLang and TRT-LLM all advertise `control/*` + `update/*`):
    #: `dynamo.families.family_verdict`. Blank = routes only; an ambiguous worker is refused.
    declared_family = models.CharField(
        max_length=32, blank=True, choices=[(f, f) for f in DECLARABLE_FAMILIES]
    )
    #: Per-namespace declarations, overriding `declared_family` (`{"rl-a": "vllm-sidecar"}`).
    #: Shape: `DeclaredFamilies` (fleet/validation.py).
    declared_families = models.JSONField(default=dict, blank=True)
    #: The Dynamo release this source's workers run, as the operator declared it (blank:
    #: 1.6.1, which reports no version to detect). Its contract (`dynamo.releases`) is named
    #: in every refresh's compatibility record.
    dynamo_release = models.CharField(max_length=16, blank=True, choices=RELEASE_CHOICES)

    reported_namespace = models.CharField(max_length=limits.NAME_MAX, blank=True)
    stale = models.BooleanField(default=False)
    stale_reason = models.TextField(blank=True)
    last_discovery_started_at = models.DateTimeField(null=True, blank=True)
    last_discovery_finished_at = models.DateTimeField(null=True, blank=True)
    last_success_at = models.DateTimeField(null=True, blank=True)
    # A discovery run claims the source until this time with a conditional UPDATE, so a duplicate
    # beat tick (or a second beat) finds it claimed and does nothing.
    discovery_claimed_until = models.DateTimeField(null=True, blank=True)

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def declared_family_for(self, namespace: str) -> str:
        """The family an operator declared for `namespace`'s workers ("" = none)."""
        per_namespace = self.declared_families if isinstance(self.declared_families, dict) else {}
        return str(per_namespace.get(namespace) or self.declared_family or "")

    def is_due(self, now: datetime) -> bool:
        """Whether a scheduled discovery run should start at `now`.

        Half a beat tick of slack: a source whose interval ends just after a tick is refreshed
        on that tick rather than a whole tick late.
        """
        last = self.last_discovery_started_at
        if last is None:
            return True
        slack = settings.DISCOVERY_TICK_SECONDS / 2
        return (now - last).total_seconds() >= self.discovery_interval_seconds - slack


class StaticWorker(models.Model):
    """A worker discovery does not report (such as SGLang), registered with a trusted URL.

    Only the allowlisted routes are ever called on it, and its URL passes the same outbound
    policy as discovered workers.
    """

    source = models.ForeignKey(Source, on_delete=models.CASCADE, related_name="static_workers")
    name = models.SlugField(max_length=64)
    namespace = models.CharField(max_length=200)
    component = models.CharField(max_length=200, default="backend")
    #: The endpoint its runtime registers with the frontend (matched in the frontend's
    #: `/health` instances to find its real instance id).
    endpoint = models.CharField(max_length=200, default="generate")
    #: The operator's declaration where several registered instances match; checked against
    #: the frontend's instances on every discovery, never trusted on its own.
    declared_instance_id = models.CharField(
        max_length=limits.INSTANCE_ID_MAX, blank=True, validators=[instance_id_validator]
    )
    system_url = models.URLField()
    family = models.CharField(max_length=32, choices=FAMILY_CHOICES)
    #: Shape: `Routes` (controlplane/jsontypes.py).
    allowed_routes = models.JSONField(default=list)
    model = models.CharField(max_length=300, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["source", "name"], name="static_worker_unique_name")
        ]

    def __str__(self) -> str:
        return f"{self.source.name}/{self.name}"


class WorkerState(models.TextChoices):
    LIVE = "live"
    ERRORING = "erroring"
    GONE = "gone"


class Liveness(models.TextChoices):
    UNKNOWN = "unknown"
    ALIVE = "alive"
    DEAD = "dead"


class Worker(models.Model):
    """One worker instance behind a source, keyed by (namespace, component, endpoint, instance_id).

    `instance_id` is Dynamo's u64 instance id kept as decimal text: it often exceeds 2^63, so
    neither a float nor a signed bigint can hold it exactly. Workers that leave are marked
    gone, never deleted, so history and journals keep pointing at them.
    """

    source = models.ForeignKey(Source, on_delete=models.CASCADE, related_name="workers")
    static_worker = models.OneToOneField(
        StaticWorker, null=True, blank=True, on_delete=models.SET_NULL, related_name="worker"
    )
    # Column sizes come from the client's storage limits (`controlplane.dynamo.limits`), which
    # discovery parsing enforces; tests/integration/fleet/test_discovery_storage.py keeps the
    # two from drifting apart.
    namespace = models.CharField(max_length=limits.NAME_MAX)
    component = models.CharField(max_length=limits.NAME_MAX)
    endpoint = models.CharField(max_length=limits.NAME_MAX)
    instance_id = models.CharField(
        max_length=limits.INSTANCE_ID_MAX, validators=[instance_id_validator]
    )

    family = models.CharField(max_length=32, blank=True)
    #: Shape: `ListenerTransport` (dynamo/listing.py): as the listener reports it.
    transport = models.JSONField(default=dict, blank=True)
    request_plane_url = models.CharField(max_length=limits.REQUEST_PLANE_URL_MAX, blank=True)
    system_url = models.CharField(max_length=limits.URL_MAX, blank=True)
    admin_base_url = models.CharField(max_length=limits.URL_MAX, blank=True)
    model = models.CharField(max_length=limits.MODEL_MAX, blank=True)
    #: Shape: `Routes` (controlplane/jsontypes.py).
    routes = models.JSONField(default=list, blank=True)
    # A u32 (up to 2^32-1): PostgreSQL's `integer` stops at 2^31-1, so this is a bigint.
    world_size = models.PositiveBigIntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    #: Static workers only: why the real instance id is unknown (`instance_id` is then empty:
    #: the worker may be refreshed by URL but is never pinned nor put in a verified set).
    identity_note = models.TextField(blank=True)

    state = models.CharField(max_length=16, choices=WorkerState.choices, default=WorkerState.LIVE)
    #: Shape: `WeightVersion` (controlplane/jsontypes.py): as the engine reports it.
    weight_version = models.JSONField(null=True, blank=True)
    weight_version_declared = models.BooleanField(default=False)
    version_error = models.TextField(blank=True)
    # When `get_weight_version` last answered; a version read before a failed probe is kept
    # (last known) but is not compared as if it were current.
    version_probed_at = models.DateTimeField(null=True, blank=True)
    liveness = models.CharField(max_length=16, choices=Liveness.choices, default=Liveness.UNKNOWN)
    liveness_error = models.TextField(blank=True)
    last_probed_at = models.DateTimeField(null=True, blank=True)

    first_seen_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()
    gone_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["namespace", "component", "endpoint", "instance_id"]
        constraints = [
            models.UniqueConstraint(
                fields=["source", "namespace", "component", "endpoint", "instance_id"],
                name="worker_unique_identity",
            )
        ]
        indexes = [
            models.Index(fields=["source", "state"], name="worker_source_state_idx"),
            # Global search (`intake.search`) looks workers up by a key prefix and by an
            # instance id prefix; pattern ops let PostgreSQL use them for `LIKE 'x%'`
            # whatever the collation (other databases ignore the opclasses).
            models.Index(
                fields=["namespace", "component", "endpoint", "instance_id"],
                name="worker_key_prefix_idx",
                opclasses=["varchar_pattern_ops"] * 4,
            ),
            models.Index(
                fields=["instance_id"],
                name="worker_instance_prefix_idx",
                opclasses=["varchar_pattern_ops"],
            ),
        ]

    def __str__(self) -> str:
        return self.key

    @property
    def key(self) -> str:
        return worker_key(self.namespace, self.component, self.endpoint, self.instance_id)

    @property
    def is_static(self) -> bool:
        return self.static_worker_id is not None

    @property
    def identity_known(self) -> bool:
        """False for a static worker whose real instance id could not be resolved."""
        return bool(self.instance_id)


class DiscoveryTrigger(models.TextChoices):
    SCHEDULE = "schedule"
    MANUAL = "manual"
    PLAN = "plan"
    REFRESH = "refresh"


class DiscoveryRun(models.Model):
    """One discovery run of a source: when it ran, how long it took, what it counted."""

    source = models.ForeignKey(Source, on_delete=models.CASCADE, related_name="discovery_runs")
    trigger = models.CharField(max_length=16, choices=DiscoveryTrigger.choices)
    started_at = models.DateTimeField(db_index=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    duration_ms = models.FloatField(null=True, blank=True)
    ok = models.BooleanField(default=False)
    error = models.TextField(blank=True)
    reported_namespace = models.CharField(max_length=limits.NAME_MAX, blank=True)
    workers_total = models.PositiveIntegerField(default=0)
    workers_live = models.PositiveIntegerField(default=0)
    workers_erroring = models.PositiveIntegerField(default=0)
    joined = models.PositiveIntegerField(default=0)
    left = models.PositiveIntegerField(default=0)
    changed = models.PositiveIntegerField(default=0)
    #: Shape: `list[RejectedEntryJson]` (fleet/discovery/rejections.py).
    rejected_entries = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["-started_at"]
        get_latest_by = "started_at"

    def __str__(self) -> str:
        return f"{self.source.name} discovery at {self.started_at:%Y-%m-%d %H:%M:%S}"


class WorkerEventKind(models.TextChoices):
    JOINED = "joined"
    LEFT = "left"
    CHANGED = "changed"
    STARTED_ERRORING = "started_erroring"
    STOPPED_ERRORING = "stopped_erroring"
    VERSION_CHANGED = "version_changed"
    LIVENESS_CHANGED = "liveness_changed"


class WorkerEvent(models.Model):
    """A change one discovery run saw in one worker; together they form the timeline."""

    source = models.ForeignKey(Source, on_delete=models.CASCADE, related_name="worker_events")
    worker = models.ForeignKey(Worker, on_delete=models.CASCADE, related_name="events")
    run = models.ForeignKey(
        DiscoveryRun, null=True, blank=True, on_delete=models.SET_NULL, related_name="events"
    )
    occurred_at = models.DateTimeField(db_index=True)
    kind = models.CharField(max_length=32, choices=WorkerEventKind.choices)
    #: Shape: `WorkerEventDetails` (fleet/discovery/diff.py).
    details = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-occurred_at", "-id"]
        indexes = [models.Index(fields=["source", "-occurred_at"], name="wevent_source_time_idx")]

    def __str__(self) -> str:
        return f"{self.worker.key} {self.kind}"


class PublishedPolicy(models.Model):
    """A policy checkpoint a trainer announced (`checkpoint.ready` or `policy.published`): a
    fact, written once. Per source and lineage, steps and versions only move forward
    (refresh/policy_lag.py refuses an older step or a version seen at another step)."""

    source = models.ForeignKey(Source, on_delete=models.CASCADE, related_name="published_policies")
    #: The training run the checkpoint belongs to ("" when the trainer names none).
    lineage = models.CharField(max_length=limits.NAME_MAX, blank=True, default="")
    step = models.PositiveBigIntegerField()
    #: The weight version workers report once they serve it (str or int, as the trainer sent).
    #: Shape: `WeightVersion` (controlplane/jsontypes.py).
    version = models.JSONField()
    #: `version` as text (`policy_lag.version_key`), for finding the step a served version is.
    version_key = models.CharField(max_length=200)
    digest = models.CharField(max_length=200, blank=True)
    #: The namespaces it is meant for; empty: every namespace of the source.
    #: Shape: `Namespaces` (controlplane/jsontypes.py).
    namespaces = models.JSONField(default=list, blank=True)
    published_at = models.DateTimeField()
    received_at = models.DateTimeField(auto_now_add=True)
    #: The delivery that announced it (`intake.ReceivedWebhook.webhook_id`).
    webhook_id = models.CharField(max_length=200, blank=True)
    event_type = models.CharField(max_length=32)
    #: Namespaces already notified of lag past this publication (`max_lag_action=alert`).
    #: Shape: `Namespaces` (controlplane/jsontypes.py).
    lag_alerted = models.JSONField(default=list, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["source", "lineage", "step"], name="published_policy_unique_step"
            )
        ]
        indexes = [
            models.Index(fields=["source", "lineage", "-step"], name="published_policy_latest"),
            models.Index(fields=["source", "version_key"], name="published_policy_version"),
            # The source's policy mark (its newest row), read with every gate poll's check.
            models.Index(fields=["source", "-id"], name="published_policy_mark"),
        ]

    def __str__(self) -> str:
        return f"{self.source_id}/{self.lineage or '-'} step {self.step}: {self.version}"


class ServingHealthPoint(models.Model):
    """One sample of a source's serving, read from its frontend's `/metrics`
    (fleet/serving_health.py): the rates and latency over the window since the previous
    sample, summed over the frontend's models, or the `error` that kept it from being read.

    A ring per source: rows older than `SERVING_HEALTH_KEEP_SECONDS` are deleted by the
    sampler itself. Kept in the database, not Redis, so the chart survives a restart of either
    and the ring is bounded by one indexed delete per tick."""

    source = models.ForeignKey(Source, on_delete=models.CASCADE, related_name="serving_health")
    taken_at = models.DateTimeField()
    #: The window the rates cover (the time since the previous sample).
    seconds = models.FloatField(null=True, blank=True)
    request_rate = models.FloatField(null=True, blank=True)
    error_rate = models.FloatField(null=True, blank=True)
    #: Errors over requests in the window; None without requests.
    error_ratio = models.FloatField(null=True, blank=True)
    ttft_p50_ms = models.FloatField(null=True, blank=True)
    ttft_p90_ms = models.FloatField(null=True, blank=True)
    duration_p50_ms = models.FloatField(null=True, blank=True)
    duration_p90_ms = models.FloatField(null=True, blank=True)
    #: A counter went down: the frontend restarted; the window counts from its restart.
    reset = models.BooleanField(default=False)
    #: Why nothing could be read (unreachable, outside the allowed networks, not metrics).
    error = models.TextField(blank=True)
    #: The busiest models of the window, each with its own rates and TTFT.
    #: Shape: `ServingModels` (fleet/serving_health.py).
    by_model = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-taken_at", "-id"]
        indexes = [
            models.Index(fields=["source", "-taken_at"], name="serving_health_recent"),
            # The prune deletes by age across every source.
            models.Index(fields=["taken_at"], name="serving_health_age"),
        ]

    def __str__(self) -> str:
        return f"{self.source_id} serving at {self.taken_at:%H:%M:%S}"
