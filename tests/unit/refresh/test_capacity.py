"""The capacity of a refresh computed from constructed journals and gate histories.

Each case writes the calls a worker received (as the journal stores them) and checks what a
person reads off the chart: who was paused when and for how long, how many engines ran per
version, how many were admitted by the gate, and how long each namespace was gated.
"""

from __future__ import annotations

import datetime as dt

import pytest

from controlplane.refresh.capacity import (
    PREVIOUS,
    UNKNOWN,
    Call,
    Capacity,
    GateChange,
    GateStart,
    Worker,
    compute,
)

T0 = dt.datetime(2025, 3, 1, 12, 0, 0, tzinfo=dt.UTC)


def t(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def pause(wid: int, at: float, *, ok: bool = True, attempt: int = 1, step="pause") -> Call:
    return Call(wid, step, attempt, "pause", ok, t(at))


def resume(wid: int, at: float, *, ok: bool = True, attempt: int = 1, step="resume_engines"):
    return Call(wid, step, attempt, "resume", ok, t(at))


def update(wid: int, at: float, *, ok: bool = True, attempt: int = 1) -> Call:
    return Call(wid, "update", attempt, "update_from_disk", ok, t(at))


def run(
    workers: list[Worker],
    calls: list[Call],
    *,
    gates: list[GateChange] = (),
    start: dict[str, GateStart] | None = None,
    end: float = 10.0,
    ongoing: bool = False,
) -> Capacity:
    return compute(
        workers=workers,
        calls=calls,
        gate_start=start if start is not None else {"a": GateStart("open", "v1")},
        gate_changes=list(gates),
        namespaces=sorted({w.namespace for w in workers}),
        target_version="v2",
        start=T0,
        end=t(end),
        ongoing=ongoing,
    )


def at(cap: Capacity, seconds: float):
    """The point in force at `seconds` (the step function's value there)."""
    current = cap.points[0]
    for point in cap.points:
        if point.at <= t(seconds):
            current = point
    return current


def by_key(cap: Capacity) -> dict[str, object]:
    return {w.key: w for w in cap.workers}


W = [Worker(1, "a/w/1", "a"), Worker(2, "a/w/2", "a"), Worker(3, "a/w/3", "a")]


def test_all_at_once_drops_to_zero_and_returns_on_the_new_version():
    calls = [pause(1, 1), pause(2, 1.5), pause(3, 2)]
    calls += [update(w, 3) for w in (1, 2, 3)]
    calls += [resume(1, 5), resume(2, 5.5), resume(3, 6)]
    gates = [GateChange("a", t(0.5), "closed", "v1"), GateChange("a", t(8), "open", "v2")]
    cap = run(W, calls, gates=gates)

    assert at(cap, 0).running == {"v1": 3} and at(cap, 0).admitted == 3
    assert at(cap, 0.7).running == {"v1": 3} and at(cap, 0.7).admitted == 0
    assert at(cap, 2).running == {} and at(cap, 2).paused == 3
    assert at(cap, 5.2).running == {"v2": 1} and at(cap, 5.2).paused == 2
    assert at(cap, 6).running == {"v2": 3} and at(cap, 6).paused == 0
    # Engines run again at 6, but nothing is admitted until the gate reopens at 8.
    assert at(cap, 7).admitted == 0 and at(cap, 8).admitted == 3

    w = by_key(cap)
    assert [iv.start for iv in w["a/w/1"].intervals] == [t(1)]
    assert w["a/w/1"].paused_seconds == pytest.approx(4.0)
    assert w["a/w/3"].paused_seconds == pytest.approx(4.0)
    s = cap.summary
    assert (s.peak_unavailable, s.peak_unavailable_at) == (3, t(2))
    assert s.worker_seconds_paused == pytest.approx(12.0)
    assert s.min_serving_fraction == 0 and s.min_admitted_fraction == 0
    assert (s.first_pause_at, s.last_resume_at) == (t(1), t(6))
    assert s.paused_at_end == 0
    assert cap.versions == ("v1", "v2")
    (ns,) = cap.namespaces
    assert ns.gated_seconds == pytest.approx(7.5) and not ns.gated_at_end
    # Engine-seconds: 3 x 10 s planned, 12 paused: 60 % served; admitted 3x0.5 + 3x2 of 30.
    assert s.mean_serving_fraction == pytest.approx(18 / 30)
    assert s.mean_admitted_fraction == pytest.approx(7.5 / 30)


def test_waves_overlap_and_the_peak_counts_the_overlap():
    workers = [*W, Worker(4, "a/w/4", "a")]
    calls = [pause(1, 1), pause(2, 1), update(1, 2), update(2, 2), pause(3, 2.5)]
    calls += [resume(1, 3), resume(2, 3.2), pause(4, 3.5), update(3, 4), update(4, 4)]
    calls += [resume(3, 5), resume(4, 5.5)]
    cap = run(workers, calls)

    assert at(cap, 2.6).paused == 3 and at(cap, 2.6).running == {"v1": 1}
    assert at(cap, 3.1).running == {"v1": 1, "v2": 1}
    assert at(cap, 3.6).running == {"v2": 2} and at(cap, 3.6).paused == 2
    assert at(cap, 6).running == {"v2": 4}
    assert cap.summary.peak_unavailable == 3
    assert cap.summary.peak_unavailable_at == t(2.5)
    assert cap.summary.min_serving_fraction == pytest.approx(1 / 4)
    # The gate stayed open throughout: whatever runs is admitted.
    assert all(p.admitted == p.serving for p in cap.points)
    assert cap.namespaces[0].gated_seconds == 0


def test_failed_calls_change_nothing_and_retries_count_from_their_success():
    calls = [pause(1, 1), pause(2, 1, ok=False), pause(3, 1)]
    calls += [pause(2, 4, attempt=2)]  # the retry of the pause step
    calls += [update(w, 4.5, attempt=1) for w in (1, 3)] + [update(2, 5, attempt=1, ok=False)]
    calls += [update(2, 6, attempt=2)]
    calls += [resume(1, 7), resume(2, 7, ok=False), resume(3, 7), resume(2, 8, attempt=2)]
    cap = run(W, calls)

    w = by_key(cap)
    assert [(iv.start, iv.end) for iv in w["a/w/2"].intervals] == [(t(4), t(8))]
    assert w["a/w/2"].paused_seconds == pytest.approx(4.0)
    assert w["a/w/2"].version == "v2"  # its second update run succeeded
    assert at(cap, 2).paused == 2 and at(cap, 2).running == {"v1": 1}
    assert at(cap, 7.5).running == {"v2": 2} and at(cap, 7.5).paused == 1
    assert cap.summary.paused_seconds_min == pytest.approx(4.0)
    assert cap.summary.paused_seconds_max == pytest.approx(6.0)
    assert cap.summary.paused_seconds_median == pytest.approx(6.0)


def test_a_worker_never_resumed_stays_paused_until_the_end():
    calls = [pause(1, 1), pause(2, 1), update(1, 2), update(2, 2), resume(1, 3)]
    gates = [GateChange("a", t(0.5), "closed", "v1")]
    cap = run(W[:2], calls, gates=gates, end=10, ongoing=True)

    w = by_key(cap)
    assert w["a/w/2"].paused_at_end and w["a/w/2"].intervals[-1].end is None
    assert w["a/w/2"].paused_seconds == pytest.approx(9.0)
    assert cap.summary.paused_at_end == 1
    assert at(cap, 9.9).paused == 1 and at(cap, 9.9).running == {"v2": 1}
    assert cap.namespaces[0].gated_at_end
    assert cap.namespaces[0].gated_seconds == pytest.approx(9.5)
    assert cap.ongoing


def test_a_takeover_repauses_without_restarting_the_interval():
    # Executor 1 paused 1 and 2 (attempt 1), died during the update; executor 2 takes over
    # (attempt 2): the update step's re-pause is journaled as pause calls again.
    calls = [pause(1, 1), pause(2, 1.2), update(1, 2)]
    calls += [pause(1, 5, attempt=2), pause(2, 5, attempt=2), pause(3, 5.1, attempt=2)]
    calls += [update(w, 6, attempt=2) for w in (1, 2, 3)]
    calls += [resume(w, 7, attempt=2) for w in (1, 2, 3)]
    cap = run(W, calls)

    w = by_key(cap)
    assert [(iv.start, iv.end) for iv in w["a/w/1"].intervals] == [(t(1), t(7))]
    assert [(iv.start, iv.end) for iv in w["a/w/3"].intervals] == [(t(5.1), t(7))]
    assert at(cap, 3).paused == 2
    assert at(cap, 7).running == {"v2": 3}


def test_a_release_after_a_failed_update_resumes_on_an_unknown_version():
    calls = [pause(1, 1), pause(2, 1), update(1, 2), update(2, 2, ok=False)]
    calls += [resume(1, 4, step="release"), resume(2, 4, step="release")]
    cap = run(W[:2], calls)

    assert at(cap, 5).running == {"v2": 1, UNKNOWN: 1}
    assert cap.versions == ("v1", "v2", UNKNOWN)
    assert by_key(cap)["a/w/2"].version == UNKNOWN


def test_paused_twice_gives_two_intervals():
    calls = [pause(1, 1), resume(1, 2), pause(1, 4, attempt=2), resume(1, 6, attempt=2)]
    cap = run(W[:1], calls)
    (worker,) = cap.workers
    assert [(iv.start, iv.end) for iv in worker.intervals] == [(t(1), t(2)), (t(4), t(6))]
    assert worker.paused_seconds == pytest.approx(3.0)


def test_gate_history_per_namespace_from_the_state_before_the_start():
    workers = [Worker(1, "a/w/1", "a"), Worker(2, "b/w/1", "b")]
    start = {"a": GateStart("open", "v1"), "b": GateStart("closed", None)}
    gates = [
        GateChange("a", t(1), "closed", "v1"),
        GateChange("a", t(3), "unknown"),  # the source went stale: still not admitting
        GateChange("a", t(4), "closed"),
        GateChange("a", t(6), "open_forced"),
        GateChange("b", t(2), "open", "v2"),
    ]
    cap = run(workers, [], gates=gates, start=start)

    gating = {n.namespace: n for n in cap.namespaces}
    assert [(iv.start, iv.end) for iv in gating["a"].intervals] == [(t(1), t(6))]
    assert gating["a"].gated_seconds == pytest.approx(5.0)
    assert [(iv.start, iv.end) for iv in gating["b"].intervals] == [(T0, t(2))]
    # Namespace b had no verified version: its workers' series is named "previous".
    assert cap.versions == ("v1", PREVIOUS, "v2")
    assert at(cap, 0).admitted == 1 and at(cap, 2).admitted == 1 and at(cap, 6).admitted == 2


def test_rows_outside_the_plan_or_after_the_end_are_ignored():
    calls = [pause(1, 1), pause(99, 1), resume(1, 12)]
    cap = run(W[:1], calls, end=10)
    (worker,) = cap.workers
    assert worker.paused_at_end and worker.paused_seconds == pytest.approx(9.0)
    assert cap.summary.workers == 1


def test_no_workers_and_no_calls():
    cap = run([], [])
    assert cap.summary.min_serving_fraction is None
    assert cap.summary.peak_unavailable == 0 and cap.summary.peak_unavailable_at is None
    assert cap.as_dict()["series"] == [
        {"at": T0.isoformat(), "running": {}, "paused": 0, "admitted": 0}
    ]


def test_the_chart_keeps_every_dip_and_the_state_after_it_at_2000_workers():
    from controlplane.refresh.capacity_chart import COLUMNS, _columns, chart

    n = 2000
    workers = [Worker(i, f"a/w/{i}", "a") for i in range(n)]
    calls = [pause(i, 1 + i / n) for i in range(n)] + [update(i, 2.5) for i in range(n)]
    calls += [resume(i, 3 + i / n) for i in range(n)]
    cap = run(workers, calls, end=100)
    assert len(cap.points) > 4000  # every change, exactly, for the API

    drawn = _columns(cap)
    assert len(drawn) <= 2 * COLUMNS

    def drawn_at(seconds: float):
        current = drawn[0]
        for cell in drawn:
            if cell[0] <= seconds:
                current = cell
        return current[1]

    # The column holding the pauses and resumes draws the worst moment of each...
    assert max(p.paused for _, p, _ in drawn) == n
    # ...and what follows is the state they left, not the dip.
    assert drawn_at(2.0).paused == n
    assert drawn_at(50).running == {"v2": n} and drawn_at(50).paused == 0
    assert drawn_at(0.5).running == {"v1": n}
    svg = chart(cap, 1)
    assert svg.startswith("<svg") and svg.count("<path") == 4  # v1, v2, paused, the admitted line


def test_the_api_series_is_bounded_and_keeps_the_worst_moment_at_10000_workers():
    from controlplane.refresh.capacity import SERIES_POINTS

    n = 10_000
    workers = [Worker(i, f"a/w/{i}", "a") for i in range(n)]
    calls = [pause(i, 1 + i / n) for i in range(n)] + [update(i, 2.5) for i in range(n)]
    calls += [resume(i, 3 + i / n) for i in range(n)]
    cap = run(workers, calls, end=100)
    assert len(cap.points) > 2 * n  # a point per change: it grows with the fleet

    body = cap.as_dict()
    series = body["series"]
    assert body["series_exact"] is False
    assert len(series) <= SERIES_POINTS
    assert max(p["paused"] for p in series) == n  # the dip is kept...
    assert series[-1]["running"] == {"v2": n} and series[-1]["paused"] == 0  # ...and the end
    assert series[0]["running"] == {"v1": n}
    assert all(sum(p["running"].values()) + p["paused"] == n for p in series)
    assert [p["at"] for p in series] == sorted(p["at"] for p in series)


def test_a_small_series_is_every_change():
    workers = [Worker(i, f"a/w/{i}", "a") for i in range(3)]
    cap = run(workers, [pause(i, 1 + i) for i in range(3)], end=10)
    body = cap.as_dict(workers=slice(1, 2))
    assert body["series_exact"] is True
    assert body["series"] == [p.as_dict() for p in cap.points]
    assert [w["key"] for w in body["workers"]] == ["a/w/1"]  # only the page's rows are built
