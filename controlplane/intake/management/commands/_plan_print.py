"""The plan as a terminal shows it: one block per distinct call plan, not one per worker.

A fleet's workers mostly share their plan (the same family, routes and bodies; only the pinned
instance of the generation check differs), so 2,000 workers print as a handful of groups, each
with its worker count, a few of its workers and its calls once. Blockers are grouped by their
text with the workers they hold. `--workers` prints every worker as well.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterable

#: Workers named per group before "and N more".
EXAMPLES = 3
#: A request body longer than this is cut (the full body is on the plan page and in --json).
BODY_CHARS = 160


def _signature(worker) -> str:
    steps = {
        step: [(c.get("method"), c.get("path")) for c in calls]
        for step, calls in (worker.calls or {}).items()
    }
    return json.dumps([worker.family, steps, worker.flush_skipped], sort_keys=True, default=str)


def _body(call: dict, shown: Callable[[object], str]) -> str:
    text = shown(call.get("body"))
    return text if len(text) <= BODY_CHARS else text[: BODY_CHARS - 1] + "…"


def plan_lines(workers: Iterable, shown: Callable[[object], str], *, every: bool) -> list[str]:
    workers = list(workers)
    lines: list[str] = []
    namespaces: dict[str, int] = defaultdict(int)
    for w in workers:
        namespaces[w.namespace] += 1
    per_ns = ", ".join(f"{shown(ns)} {n}" for ns, n in sorted(namespaces.items()))
    lines.append(f"  {len(workers)} worker(s): {per_ns}")
    groups: dict[str, list] = defaultdict(list)
    for w in workers:
        groups[_signature(w)].append(w)
    for members in sorted(groups.values(), key=len, reverse=True):
        first = members[0]
        named = ", ".join(shown(w.key) for w in members[:EXAMPLES])
        more = f" and {len(members) - EXAMPLES} more" if len(members) > EXAMPLES else ""
        lines.append(f"  {len(members)} x [{first.family or '?'}] e.g. {named}{more}")
        for step, calls in (first.calls or {}).items():
            text = ", ".join(f"{c['method']} {shown(c['path'])} {_body(c, shown)}" for c in calls)
            if not calls and step == "flush" and first.flush_skipped:
                text = f"skipped: {shown(first.flush_skipped)}"
            lines.append(f"      {step}: {text or '-'}")
    blocked: dict[str, list] = defaultdict(list)
    for w in workers:
        for blocker in w.blockers or []:
            blocked[blocker].append(w)
    for blocker, members in blocked.items():
        named = ", ".join(shown(w.key) for w in members[:EXAMPLES])
        more = f" and {len(members) - EXAMPLES} more" if len(members) > EXAMPLES else ""
        lines.append(f"  BLOCKED: {shown(blocker)} ({len(members)}: {named}{more})")
    if every:
        lines.append("  every worker:")
        for w in workers:
            lines.append(f"    {shown(w.key)} [{w.family or '?'}] {shown(w.system_url)}")
            for blocker in w.blockers or []:
                lines.append(f"      BLOCKED: {shown(blocker)}")
    return lines
