"""Fork safety: the one place that keeps process-wide state for the rest of eventstore.

A process that forks while another thread holds a lock, or sits between two steps of a
change, hands its child that lock held forever and that change half made. Objects that
keep such state (stores, engines, the collector pause, the session-id clock) register
here, and a forked child resets each before it runs anything else: one
`os.register_at_fork` hook for the whole library, so its order is the order of
registration and nothing is reset twice.

    process.track(obj)      obj.reset_after_fork() runs in a forked child while obj lives
    process.at_fork(fn)     fn() runs in a forked child (a module's own reset)

Everything else in eventstore is free of module state; the memory engine's named stores
(`memory://NAME`, shared by name within the process) are the one other exception, and
register their reset here too.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from typing import Protocol

__all__ = ["ResetAfterFork", "at_fork", "track"]


class ResetAfterFork(Protocol):
    """What `track` takes: an object that can make itself safe in a forked child."""

    def reset_after_fork(self) -> None:
        """Replace locks another thread of the parent may hold; drop half-made state."""


_guard = threading.Lock()
_tracked: weakref.WeakSet[ResetAfterFork] = weakref.WeakSet()
_calls: list[Callable[[], None]] = []


def track(obj: ResetAfterFork) -> None:
    """Call `obj.reset_after_fork()` in every forked child while `obj` is alive."""
    with _guard:
        _tracked.add(obj)


def at_fork(fn: Callable[[], None]) -> Callable[[], None]:
    """Call `fn()` in every forked child (usable as a decorator); returns `fn`."""
    with _guard:
        _calls.append(fn)
    return fn


def _after_fork_in_child() -> None:
    global _guard
    _guard = threading.Lock()  # the parent's may have been held by another thread
    for fn in list(_calls):
        fn()
    for obj in list(_tracked):
        obj.reset_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
