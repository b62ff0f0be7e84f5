"""Keeping the cyclic garbage collector off the process's long-lived heap during refreshes.

A worker process holds a couple of hundred thousand objects that live as long as it does
(modules, Django's app registry, model metadata, template and URL caches). A policy refresh
allocates enough containers (call records, decoded replies, journal rows) to trigger a full
collection in most runs, and a full collection walks that whole heap: ~130 ms of CPU per
refresh of 500 workers, about a tenth of the executor's cost, for nothing it could free.

`settle_long_lived_heap` collects once, then moves every object still alive into the permanent
generation (`gc.freeze`), which collections skip; objects made afterwards (every refresh's
own) are collected exactly as before. Reference counting is untouched, so a frozen object that
is released is still freed at once; only a reference cycle among frozen objects that becomes
garbage later stays until the process exits — a bounded, one-off amount, since what is alive
when the first refresh starts is the process's own furniture. Done once per process.
"""

from __future__ import annotations

import gc
import threading

_settled = False
_lock = threading.Lock()


def settle_long_lived_heap() -> bool:
    """Freeze what is alive now, once per process. Returns True when this call did it."""
    global _settled
    if _settled:
        return False
    with _lock:
        if _settled:
            return False
        gc.collect()
        gc.freeze()
        _settled = True
        return True
