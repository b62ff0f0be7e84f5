"""Policy lag of gate rows, many at once: `lags_by_gate` and `with_lags` read a few rows per
source (`policy_lag.lags_of`, `policy_lag.with_lags_of`, which builds the payload `with_lag`
does), not per gate, for the gates page and API and `/metrics`.

Apart from `policy_lag` because they serialise gates (`gates.serialize_gate`), and the gate
module's Redis copies (`gate_cache`) import `policy_lag`: here, above both, no import cycles.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from django.db.models import Max

from controlplane.fleet.models import PublishedPolicy
from controlplane.refresh.gates import serialize_gate
from controlplane.refresh.models import Gate
from controlplane.refresh.policy_lag import Lag, lags_of, with_lags_of


def _by_source(gates: Iterable[Gate]) -> list[list[Gate]]:
    """`gates` grouped by source, each group in the gates' order."""
    by_source: dict[int, list[Gate]] = {}
    for gate in gates:
        by_source.setdefault(gate.source_id, []).append(gate)
    return list(by_source.values())


def lags_by_gate(gates: Iterable[Gate]) -> dict[int, Lag | None]:
    """Per gate id, its lag (`lags_of` per source: a few reads per source, not per gate).
    The gates' `source` is read as loaded (select it with them)."""
    out: dict[int, Lag | None] = {}
    for same in _by_source(gates):
        found = lags_of(same[0].source, [(g.namespace, serialize_gate(g)) for g in same])
        out.update(zip((g.pk for g in same), found, strict=True))
    return out


def with_lags(gates: Sequence[Gate]) -> list[dict[str, Any]]:
    """`with_lag` for each of `gates` (sources selected with them), in order: one read for
    every source's mark, then `with_lags_of`'s few per source, however many gates."""
    marks = dict(
        PublishedPolicy.objects.filter(source_id__in={g.source_id for g in gates})
        .values("source_id")
        .annotate(mark=Max("pk"))
        .values_list("source_id", "mark")
    )
    by_gate: dict[int, dict[str, Any]] = {}
    for same in _by_source(gates):
        source = same[0].source
        payloads = [serialize_gate(g) for g in same]
        found = with_lags_of(source, payloads, mark=int(marks.get(source.pk) or 0))
        by_gate.update(zip((g.pk for g in same), found, strict=True))
    return [by_gate[gate.pk] for gate in gates]
