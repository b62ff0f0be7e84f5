"""The provenance page of a weight version (read-only, for every role that may view)."""

from __future__ import annotations

from typing import Any

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from controlplane.accounts.access import requires
from controlplane.accounts.roles import Perm
from controlplane.intake.provenance.trail import RefreshTrail, trail
from controlplane.refresh.step_order import STEP_LABELS, WORKER_STEPS

#: Worker rows a refresh's section shows (the workers that did not verify first); the JSON
#: export lists every worker. A fleet of 10,000 would otherwise be a page of 10,000 rows.
WORKER_ROWS = 200
#: Verified instance ids shown per namespace (the count says how many there are).
VERIFIED_IDS = 50


def _section(t: RefreshTrail) -> dict[str, Any]:
    unverified = [w for w in t.workers if not w.verified][:WORKER_ROWS]
    room = WORKER_ROWS - len(unverified)
    verified_rows = [w for w in t.workers if w.verified][: max(room, 0)]
    chosen = {id(w) for w in unverified} | {id(w) for w in verified_rows}
    verified = [
        (ns, ids[:VERIFIED_IDS], len(ids), max(len(ids) - VERIFIED_IDS, 0))
        for ns, ids in t.verified_instances.items()
    ]
    return {
        "trail": t,
        "workers": [w for w in t.workers if id(w) in chosen],
        "hidden": max(len(t.workers) - len(chosen), 0),
        "verified": verified,
    }


@require_GET
@requires(Perm.VIEW)
def version_provenance(request: HttpRequest, version: str) -> HttpResponse:
    found = trail(version)
    if found.empty:
        raise Http404("no record names this weight version")
    context = {
        "trail": found,
        "sections": [_section(t) for t in found.refreshes],
        "steps": [(step.value, STEP_LABELS[step]) for step in WORKER_STEPS],
    }
    return render(request, "provenance/version.html", context)
