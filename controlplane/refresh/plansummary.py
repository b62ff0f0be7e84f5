"""What a planned refresh will do, in a few lines an operator reads before confirming.

The plan preview leads with this summary (workers ready/blocked per namespace, update methods,
pause mode per family, what will pause, the expected duration) and then the blockers grouped
by kind, each with the fix an operator can act on. Everything is counted by the database, so
the summary costs the same few queries at 12 workers or 2,000.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from datetime import timedelta

from django.db.models import Count, F, Q

from controlplane.refresh.models import PolicyRefresh, RefreshState
from controlplane.refresh.step_order import StepName
from controlplane.refresh.strategy import stored

#: How many past successful refreshes of the same source the expected duration looks at.
HISTORY_SIZE = 20


@dataclass(frozen=True, slots=True)
class NamespaceCount:
    namespace: str
    ready: int
    blocked: int


@dataclass(frozen=True, slots=True)
class ExpectedDuration:
    """The median duration of the source's recent successful refreshes (None: no history)."""

    median: timedelta | None
    samples: int
    shortest: timedelta | None = None
    longest: timedelta | None = None


@dataclass(frozen=True, slots=True)
class BlockerGroup:
    """Blockers of one kind, the fix for them, and the workers (or the plan) they hit."""

    kind: str
    fix: str
    messages: list[str] = field(default_factory=list)
    workers: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class PlanSummary:
    namespaces: list[NamespaceCount]
    ready: int
    blocked: int
    methods: list[tuple[str, int]]
    #: (family, pause mode sent, workers): what each family's workers are told.
    pause_by_family: list[tuple[str, str, int]]
    pausing_workers: int
    pausing_namespaces: list[str]
    expected: ExpectedDuration
    blocker_groups: list[BlockerGroup]
    #: How the refresh walks its scope (`refresh.strategy`), in one line, and the most
    #: workers one wave pauses at once.
    strategy: str = "all at once"
    waves: int = 1
    largest_wave: int = 0

    @property
    def total(self) -> int:
        return self.ready + self.blocked


def _human(delta: timedelta) -> str:
    seconds = round(delta.total_seconds())
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s" if seconds else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


def describe_duration(expected: ExpectedDuration) -> str:
    if expected.median is None:
        return "no history yet"
    text = f"about {_human(expected.median)} (median of {expected.samples} successful refresh"
    text += "es" if expected.samples != 1 else ""
    if expected.samples > 1 and expected.shortest and expected.longest:
        text += f", {_human(expected.shortest)} to {_human(expected.longest)}"
    return text + ")"


def expected_duration(refresh: PolicyRefresh) -> ExpectedDuration:
    """From the same source's latest successful refreshes: start to finish, median."""
    spans = list(
        PolicyRefresh.objects.filter(
            source_id=refresh.source_id,
            state=RefreshState.SUCCEEDED,
            started_at__isnull=False,
            finished_at__isnull=False,
        )
        .exclude(pk=refresh.pk)
        .order_by("-finished_at")
        .annotate(span=F("finished_at") - F("started_at"))
        .values_list("span", flat=True)[:HISTORY_SIZE]
    )
    if not spans:
        return ExpectedDuration(None, 0)
    return ExpectedDuration(statistics.median(spans), len(spans), min(spans), max(spans))


#: Kinds of blockers (matched on the text planning writes) and what fixes them. The first
#: match wins; the text itself is always shown next to the fix.
FIXES: tuple[tuple[str, re.Pattern[str], str], ...] = (
    (
        "missing route",
        re.compile(r"missing route|does not advertise"),
        "The worker must advertise this admin route: check its Dynamo version and the flags "
        "it was started with (the system port and the engine's admin endpoints), then run "
        "discovery again and plan anew.",
    ),
    (
        "probe error",
        re.compile(r"^probe error"),
        "Discovery could not probe this worker: check that it is up and reachable, then run "
        "discovery again and plan anew.",
    ),
    (
        "no system port",
        re.compile(r"no system_url"),
        "Start the worker with its system port enabled (DYN_SYSTEM_PORT) so it advertises a "
        "system URL, then run discovery again.",
    ),
    (
        "outside the allowed networks",
        re.compile(r"outside the allowed networks|allowed networks are invalid"),
        "Add the worker's (or frontend's) network to the source's allowed networks, or fix the "
        "address it advertises.",
    ),
    (
        "unknown route family",
        re.compile(r"no known admin route family"),
        "The worker advertises no admin routes this control plane knows: check its engine and "
        "Dynamo version, or add its family to the route allowlist.",
    ),
    (
        "route allowlist",
        re.compile(r"^route allowlist"),
        "The advertised routes do not match the source's route allowlist: fix the allowlist "
        "or the worker's routes.",
    ),
    (
        "pause mode",
        re.compile(r"^pause:"),
        "Pick a pause mode this family accepts (auto always works), per family if needed.",
    ),
    (
        "update method",
        re.compile(r"^update:"),
        "Pick an update method the worker's family supports, or start the worker with the "
        "routes this method needs.",
    ),
    (
        "verification",
        re.compile(r"^verify:|generation check needs"),
        "Give the source its frontend URL and model name, or plan without the generation check.",
    ),
    (
        "ranks",
        re.compile(r"world_size|different models"),
        "Every worker must advertise its world size and serve the same model: restart the "
        "odd ones out or plan one refresh per model.",
    ),
)
OTHER_FIX = "Read the message, fix the worker or the source, then plan again."


def _kind_of(message: str) -> tuple[str, str]:
    for kind, pattern, fix in FIXES:
        if pattern.search(message):
            return kind, fix
    return "other", OTHER_FIX


def group_blockers(
    plan_blockers: list[str], worker_blockers: list[tuple[str, list[str]]]
) -> list[BlockerGroup]:
    """Blockers by kind, in the order of `FIXES`: each kind's distinct messages and workers."""
    groups: dict[str, BlockerGroup] = {}

    def add(message: str, worker: str | None) -> None:
        kind, fix = _kind_of(str(message))
        group = groups.setdefault(kind, BlockerGroup(kind, fix))
        if message not in group.messages:
            group.messages.append(str(message))
        if worker and worker not in group.workers:
            group.workers.append(worker)

    for message in plan_blockers:
        add(message, None)
    for key, messages in worker_blockers:
        for message in messages:
            add(message, key)
    order = [kind for kind, _, _ in FIXES] + ["other"]
    return sorted(groups.values(), key=lambda g: order.index(g.kind))


def plan_summary(refresh: PolicyRefresh) -> PlanSummary:
    workers = refresh.workers.all()
    unblocked = Q(blockers=[])
    namespaces = [
        NamespaceCount(row["namespace"], row["ready"], row["total"] - row["ready"])
        for row in workers.order_by("namespace")
        .values("namespace")
        .annotate(total=Count("id"), ready=Count("id", filter=unblocked))
    ]
    methods = list(
        workers.exclude(update_method="")
        .order_by("update_method")
        .values_list("update_method")
        .annotate(n=Count("id"))
    )
    pause_by_family = [
        (family or "unknown", mode or "none", n)
        for family, mode, n in workers.order_by("family", "pause_mode")
        .values_list("family", "pause_mode")
        .annotate(n=Count("id"))
    ]
    # A worker pauses when its plan holds at least one pause call.
    pausing = workers.filter(**{f"calls__{StepName.PAUSE.value}__0__isnull": False})
    pausing_namespaces = list(
        pausing.order_by("namespace").values_list("namespace", flat=True).distinct()
    )
    worker_blockers = list(
        workers.exclude(unblocked).order_by("namespace", "key").values_list("key", "blockers")
    )
    return PlanSummary(
        namespaces=namespaces,
        ready=sum(n.ready for n in namespaces),
        blocked=sum(n.blocked for n in namespaces),
        methods=methods,
        pause_by_family=pause_by_family,
        pausing_workers=pausing.count(),
        pausing_namespaces=pausing_namespaces,
        expected=expected_duration(refresh),
        blocker_groups=group_blockers(list(refresh.plan_blockers or []), worker_blockers),
        strategy=strategy_line(refresh),
        waves=refresh.waves,
        largest_wave=max(
            (n for _, n in pausing.order_by("wave").values_list("wave").annotate(n=Count("id"))),
            default=0,
        ),
    )


def strategy_line(refresh: PolicyRefresh) -> str:
    """The strategy in words, with what it means for this plan's waves."""
    line = stored(refresh).describe()
    if refresh.instances is not None:
        line += f"; only instance(s) {', '.join(refresh.instances)}, the rest keep serving"
    if refresh.waves > 1:
        line += f" — {refresh.waves} waves"
    return line
