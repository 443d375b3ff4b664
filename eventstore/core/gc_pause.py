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
import os
import threading
from types import TracebackType

__all__ = ["paused_gc"]

_lock = threading.Lock()
_depth = 0  # pauses held, by every thread
_resume = False  # whether the collector was enabled when the first of them began


class _PausedGC:
    """A context manager: the collector is off inside (see the module docstring)."""

    __slots__ = ()

    def __enter__(self) -> None:
        global _depth, _resume
        with _lock:
            if not _depth:
                _resume = gc.isenabled()
                gc.disable()
            _depth += 1

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        global _depth
        with _lock:
            if not _depth:  # reset by a fork while this thread held its pause
                return
            _depth -= 1
            if not _depth and _resume:
                gc.enable()


paused_gc = _PausedGC()


def _after_fork_in_child() -> None:
    global _lock, _depth
    _lock = threading.Lock()  # the parent's may have been held by another thread
    if _depth:
        _depth = 0
        if _resume:
            gc.enable()


os.register_at_fork(after_in_child=_after_fork_in_child)
