"""The executor takes the process's long-lived objects out of the collector's way, once."""

from __future__ import annotations

import gc
import weakref

from controlplane.refresh.executor import heap


def test_settling_freezes_what_is_alive_once_and_later_objects_stay_collectable(monkeypatch):
    monkeypatch.setattr(heap, "_settled", False)
    before = object()  # alive now: frozen
    frozen_before = gc.get_freeze_count()
    try:
        assert heap.settle_long_lived_heap() is True
        assert gc.get_freeze_count() > frozen_before
        assert heap.settle_long_lived_heap() is False  # once per process

        class Node:
            pass

        # A cycle made after settling is still found by an ordinary collection.
        a, b = Node(), Node()
        a.other, b.other = b, a
        gone = weakref.ref(a)
        del a, b
        assert gone() is not None  # reference counting alone cannot free a cycle
        gc.collect()
        assert gone() is None
    finally:
        gc.unfreeze()  # leave the test process as it was
    assert before is not None
