"""Start-up progress for the embedded runtime: one line per stage, as it begins.

A first start migrates a fresh database and waits for the first discovery, which takes tens of
seconds; a silent terminal for that long looks hung. Each line carries the seconds since the
start, and is flushed at once so it shows up even when stdout is a pipe or a file.
"""

import time
from collections.abc import Callable


class Stages:
    def __init__(self, write: Callable[[str], object], flush: Callable[[], object]) -> None:
        self._write = write
        self._flush = flush
        self._started = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self._started

    def stage(self, text: str) -> None:
        """Announce a stage before it runs, so the line says what the wait is for."""
        self._write(f"[{self.elapsed():5.1f} s] {text}")
        self._flush()
