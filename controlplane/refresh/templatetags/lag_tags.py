"""`{% load lag_tags %}{% gate_lag gate %}` and `{% source_lag source %}`: policy lag on pages.

How far the version a namespace's gate admits is behind the trainer's latest published policy
(refresh/policy_lag.py), read from the gate as the gate module serialises it: the same figures
the gate API's `policy_lag` shows.
"""

from django import template

from controlplane.refresh.gate_lags import lags_by_gate
from controlplane.refresh.gates import serialize_gate
from controlplane.refresh.models import Gate
from controlplane.refresh.policy_lag import lag_of, lags_of

register = template.Library()


@register.inclusion_tag("refresh/policy_lag.html", takes_context=True)
def gate_lag(context, gate: Gate):
    # A table of gates (`gate_rows`) has every row's lag read at the first row, a few reads
    # per source rather than a few per gate; a row rendered alone reads its own.
    lags = context.render_context.get(_LAGS)
    if lags is None:
        rows = context.get("gate_rows") or []
        lags = context.render_context[_LAGS] = lags_by_gate(row.gate for row in rows)
    if gate.pk in lags:
        return {"lag": lags[gate.pk]}
    return {"lag": lag_of(gate.source, gate.namespace, serialize_gate(gate))}


_LAGS = "refresh.lag_tags.lags"


@register.inclusion_tag("refresh/policy_lag_list.html")
def source_lag(source):
    gates = list(Gate.objects.filter(source=source).order_by("namespace"))
    lags = lags_of(source, [(gate.namespace, serialize_gate(_of(gate, source))) for gate in gates])
    rows = [(gate.namespace, lag) for gate, lag in zip(gates, lags, strict=True)]
    return {"rows": rows, "source": source}


def _of(gate: Gate, source) -> Gate:
    gate.source = source
    return gate
