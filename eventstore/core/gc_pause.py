"""Pausing the cyclic garbage collector while a cold load folds a whole log.

A cold load of a long transcript allocates a few containers per message (its `blocks`
list and `metadata` dict, the caller's copies of them): objects that outlive the load,
so every 700 of them set off a collection pass that frees nothing, every tenth pass a
wider one, and at about 70,000 a pass over every object the process holds (11 ms of a
90 ms load of 10,000 turns, on top of 5 ms of smaller passes). Decoded records cannot
form cycles, so nothing is lost by collecting after the load instead of during it; a
user's projection may make cyclic garbage as it folds, so its cold loads pause only when
it says they may (`pause_gc = True`, see `SessionStore`).

The collector's switch is process-wide, so pauses are counted: loads overlapping in
several threads pause it once, and the last to end resumes it, only if it was enabled
when the first began. A child forked while another thread holds a pause resumes it at
once (that thread does not exist in the child). A `gc.disable()` made by other code
while a load holds a pause is undone when the pause ends.
"""

from __future__ import annotations

import gc
import threading
from types import TracebackType

from eventstore import process

__all__ = ["paused_gc"]


class _PausedGC:
    """A context manager: the collector is off inside (see the module docstring). The
    one instance, `paused_gc`, counts the pauses held by every thread."""

    __slots__ = ("__weakref__", "_depth", "_lock", "_resume")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._depth = 0  # pauses held, by every thread
        self._resume = False  # whether the collector was enabled when the first began

    def __enter__(self) -> None:
        with self._lock:
            if not self._depth:
                self._resume = gc.isenabled()
                gc.disable()
            self._depth += 1

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with self._lock:
            if not self._depth:  # reset by a fork while this thread held its pause
                return
            self._depth -= 1
            if not self._depth and self._resume:
                gc.enable()

    def reset_after_fork(self) -> None:
        """The thread holding a pause does not exist in a forked child: resume now."""
        self._lock = threading.Lock()  # the parent's may have been held by another thread
        if self._depth:
            self._depth = 0
            if self._resume:
                gc.enable()


paused_gc = _PausedGC()
process.track(paused_gc)
