"""`{% load lag_tags %}{% gate_lag gate %}` and `{% source_lag source %}`: policy lag on pages.

How far the version a namespace's gate admits is behind the trainer's latest published policy
(refresh/policy_lag.py), read from the gate as the gate module serialises it: the same figures
the gate API's `policy_lag` shows.
"""

from django import template

from controlplane.refresh.gates import serialize_gate
from controlplane.refresh.models import Gate
from controlplane.refresh.policy_lag import lag_of

register = template.Library()


@register.inclusion_tag("refresh/policy_lag.html")
def gate_lag(gate: Gate):
    lag = lag_of(gate.source, gate.namespace, serialize_gate(gate))
    return {"lag": lag}


@register.inclusion_tag("refresh/policy_lag_list.html")
def source_lag(source):
    rows = []
    for gate in Gate.objects.filter(source=source).order_by("namespace"):
        gate.source = source
        rows.append((gate.namespace, lag_of(source, gate.namespace, serialize_gate(gate))))
    return {"rows": rows, "source": source}
