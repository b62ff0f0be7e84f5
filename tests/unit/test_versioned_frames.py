"""What a socket is sent of `Versioned` frames: each version of a thing at most once, never an
older one after a newer, counting from its resync; plain frames always."""

from __future__ import annotations

from controlplane.realtime.fanout import Subscription, Versioned


def frame(gate: int, revision: int) -> Versioned:
    return Versioned(f"gate {gate} at {revision}", ((gate, revision),))


def socket() -> Subscription:
    return Subscription(stream=None, writer=None)  # type: ignore[arg-type]


def test_a_resync_sets_where_the_socket_starts_and_is_always_sent():
    sub = socket()
    snapshot = Versioned("snapshot", ((1, 3), (2, 5)))
    assert sub.take([snapshot], resync=True) == ["snapshot"]
    assert sub.take([frame(1, 3)]) == []  # the snapshot showed it
    assert sub.take([frame(2, 4)]) == []  # older than the snapshot's
    assert sub.take([frame(1, 4), frame(2, 6)]) == ["gate 1 at 4", "gate 2 at 6"]


def test_each_revision_once_and_never_an_older_one_after_a_newer():
    sub = socket()
    assert sub.take([frame(7, 2)]) == ["gate 7 at 2"]
    assert sub.take([frame(7, 2)]) == []  # the watch sent it, then its push came
    assert sub.take([frame(7, 4)]) == ["gate 7 at 4"]
    assert sub.take([frame(7, 3)]) == []  # a delivery that read earlier, late
    assert sub.take([frame(8, 1)]) == ["gate 8 at 1"]  # another gate: its own count


def test_plain_frames_are_always_sent_and_empty_ones_never():
    sub = socket()
    assert sub.take(["a", "", "a"]) == ["a", "a"]
    assert sub.versions == {}
