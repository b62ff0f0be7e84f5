"""Acting on policy lag: a source's `max_lag_action` for its namespaces past `max_lag_steps`.

`observe` does nothing beyond showing the lag (policy_lag.py). `alert` notifies
`policy.lag_exceeded` once per namespace and latest publication (remembered on that
publication's row, so a later publication alerts again). `close` closes the namespace's gate
with a reason that starts `stale_policy:`; it reopens the usual way, when a refresh verifies a
version within bounds (or a person force-reopens it).

Evaluated after every publication (`refresh.enforce_policy_lag`, sent by intake on commit) and
on the discovery tick's beat, for every source whose action is not `observe`. Only gates that
admit (open, open_forced) and that no refresh holds are judged: a refresh in progress is
already moving the namespace on.

Every closure goes through `close_for_stale_policy`, the one call into the gate writer.
"""

from __future__ import annotations

from django.db import transaction

from controlplane.audit.recorder import Actor
from controlplane.fleet.models import MaxLagAction, PublishedPolicy, Source
from controlplane.notify.emit import notify
from controlplane.refresh import gates
from controlplane.refresh.models import Closure, Gate, GateState
from controlplane.refresh.policy_lag import Lag, lag_of

#: The reason a gate closed for policy lag starts with this (API `reason`, pages).
STALE_POLICY = "stale_policy"
LAG_EVENT = "policy.lag_exceeded"
ACTOR = Actor.system("policy lag")


def close_for_stale_policy(gate_id: int, reason: str) -> None:
    """Close one gate because its namespace serves a stale policy: the only place policy lag
    writes a gate. It is a closing fact of its own kind (`Closure.STALE_POLICY`): every
    admission in the ledger ends here, and a refresh that verifies a version within bounds (or
    a force-reopen) is the exit. A gate already closed keeps the closure it has."""
    with transaction.atomic():
        gate = gates.locked_gate(gate_id)
        if gate is None or gate.state == GateState.CLOSED:
            return
        gates.close_gate(gate, actor=ACTOR, closure=Closure.STALE_POLICY, reason=reason)


def reason_for(lag: Lag) -> str:
    return (
        f"{STALE_POLICY}: serving {lag.serving_version} (step {lag.serving_step}), "
        f"{lag.steps} steps behind step {lag.latest_step} ({lag.latest_version}); "
        f"at most {lag.max_lag_steps} allowed"
    )


def enforce(source_id: int) -> list[str]:
    """Apply the source's max-lag policy now; the namespaces acted on."""
    source = Source.objects.filter(pk=source_id).first()
    if source is None or source.max_lag_action == MaxLagAction.OBSERVE:
        return []
    acted = []
    for gate in Gate.objects.filter(source=source).select_related("source").order_by("namespace"):
        payload = gates.serialize_gate(gate)
        if not payload["open"] or payload["active_refresh_id"] is not None:
            continue
        lag = lag_of(source, gate.namespace, payload)
        if lag is None or not lag.exceeded:
            continue
        if source.max_lag_action == MaxLagAction.CLOSE:
            close_for_stale_policy(gate.pk, reason_for(lag))
            acted.append(gate.namespace)
        elif _alert_once(source, gate, lag):
            acted.append(gate.namespace)
    return acted


def _alert_once(source: Source, gate: Gate, lag: Lag) -> bool:
    with transaction.atomic():
        latest = (
            PublishedPolicy.objects.select_for_update(no_key=True)
            .filter(source=source, lineage=lag.lineage, step=lag.latest_step)
            .first()
        )
        if latest is None or gate.namespace in latest.lag_alerted:
            return False
        latest.lag_alerted = sorted({*latest.lag_alerted, gate.namespace})
        latest.save(update_fields=["lag_alerted"])
        notify(LAG_EVENT, source=source, gate=gate, reason=reason_for(lag))
    return True


def sources_to_enforce() -> list[int]:
    return list(
        Source.objects.exclude(max_lag_action=MaxLagAction.OBSERVE).values_list("pk", flat=True)
    )
