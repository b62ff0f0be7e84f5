"""A staged gate's `unverified_count` follows its instance sets through every move: a wave
staged, verified (admitted or not), left out by the budget, a canary rolled back. The count is
what the gate API tells trainers about the workers outside the verified set, so a move that
forgot to adjust it left the gate saying something false."""

from __future__ import annotations

import pytest
from django.db import transaction

from controlplane.audit.recorder import Actor
from controlplane.refresh import gates, ledger
from controlplane.refresh.models import Gate
from tests.integration.refresh.helpers import plan

pytestmark = pytest.mark.django_db(transaction=True)

NS = "rl-a"


def _gate(source) -> Gate:
    return Gate.objects.get(source=source, namespace=NS)


def _staged(source, operator):
    refresh = plan(source, operator, "v2")
    gates.begin_staged(refresh, actor=Actor.system("test"), reason="waves", waves=2)
    gate = _gate(source)
    ids = list(gate.verified_instances)
    assert len(ids) == 4 and gate.unverified_count == 0
    return refresh, ids


def test_admitting_waves_count_the_old_set_as_unverified_at_the_new_version(source, operator):
    refresh, ids = _staged(source, operator)
    first, rest = ids[:2], ids[2:]

    gates.stage_wave(refresh, 1, {NS: first}, reason="wave 1 paused")
    assert _gate(source).unverified_count == 2  # in flight, out of the verified set

    gates.wave_verified(refresh, {NS: first}, admit=True, reason="wave 1 verified")
    gate = _gate(source)
    # The gate now stands for v2 with the first wave; the two still on v1 are outside it.
    assert gate.verified_version == refresh.weight_version
    assert sorted(gate.verified_instances) == sorted(first)
    assert gate.unverified_count == 2

    gates.stage_wave(refresh, 2, {NS: rest}, reason="wave 2 paused")
    assert _gate(source).unverified_count == 2
    gates.wave_verified(refresh, {NS: rest}, admit=True, reason="wave 2 verified")
    gate = _gate(source)
    assert sorted(gate.verified_instances) == sorted(ids)
    assert gate.unverified_count == 0


def test_waves_without_admission_count_the_new_set_as_unverified(source, operator):
    refresh, ids = _staged(source, operator)
    gates.stage_wave(refresh, 1, {NS: ids[:2]}, reason="wave 1 paused")
    gates.wave_verified(refresh, {NS: ids[:2]}, admit=False, reason="wave 1 verified")
    gate = _gate(source)
    # Still the v1 gate: it admits the two serving v1; the two on v2 are outside its set.
    assert sorted(gate.verified_instances) == sorted(ids[2:])
    assert gate.unverified_count == 2


def test_a_worker_left_out_from_the_old_set_counts_as_unverified(source, operator):
    refresh, ids = _staged(source, operator)
    gates.wave_left_out(refresh, {NS: ids[:1]}, reason="left out by the budget")
    gate = _gate(source)
    assert ids[0] not in gate.verified_instances
    assert gate.unverified_count == 1
    assert gate.instance_sets["left_out"] == ids[:1]


def test_a_canary_rolled_back_rejoins_the_verified_set_and_the_count_falls(source, operator):
    refresh, ids = _staged(source, operator)
    canary = ids[:1]
    gates.stage_wave(refresh, 1, {NS: canary}, reason="canary paused")
    assert _gate(source).unverified_count == 1
    gates.wave_verified(refresh, {NS: canary}, admit=False, reason="canary verified")
    gates.canary_rolled_back(refresh, {NS: canary}, reason="canary rolled back")
    gate = _gate(source)
    assert sorted(gate.verified_instances) == sorted(ids)
    assert gate.unverified_count == 0


def test_workers_unverified_outside_the_staged_sets_stay_counted(source, operator):
    refresh, ids = _staged(source, operator)
    # One more serving worker the gate never verified (say a joiner seen by discovery before
    # the refresh took the gate): it is not in any staged set and must not be forgotten.
    # The ledger knows it (discovery recorded it, version reported, not admitted).
    with transaction.atomic():
        ledger.write(source, {(NS, "999"): {"version": "v0"}}, cause="joined")
    gates.stage_wave(refresh, 1, {NS: ids[:2]}, reason="wave 1 paused")
    assert _gate(source).unverified_count == 3
    gates.wave_verified(refresh, {NS: ids[:2]}, admit=True, reason="wave 1 verified")
    assert _gate(source).unverified_count == 3  # two on v1 + the outsider
