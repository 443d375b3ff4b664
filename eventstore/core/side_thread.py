"""A helper thread for one long load: it hashes a piece of the log while the caller
decodes it, two steps that otherwise take turns.

`hashlib` releases the GIL over a large buffer and msgspec's decoding holds it, so on
two cores the hash costs the caller next to nothing, provided the helper is inside the
hash before the caller starts decoding: a thread waiting for the GIL gets it from a
busy caller only after the 5 ms switch interval. So `submit` returns once the call has
started, and a job should be one call that releases the GIL at once. The thread lives
only while the load does (`close` joins it): nothing outlives the call, so a process
forked later has no half-owned pool to deadlock on.
"""

from __future__ import annotations

import _thread
import threading
from collections.abc import Callable
from queue import SimpleQueue
from typing import Any, Generic, TypeVar

__all__ = ["Job", "SideThread", "start_side_thread"]

T = TypeVar("T")


class Job(Generic[T]):
    """One call submitted to a `SideThread`; `result()` waits for it."""

    __slots__ = ("_args", "_done", "_error", "_fn", "_started", "_value")

    def __init__(self, fn: Callable[..., T], args: tuple[Any, ...]) -> None:
        self._fn = fn
        self._args = args
        self._value: T | None = None
        self._error: BaseException | None = None
        self._done = threading.Lock()  # held until the call ends: a one-shot latch
        self._done.acquire()
        self._started = threading.Lock()  # held until the call is about to start
        self._started.acquire()

    def run(self) -> None:
        """Make the call (on the side thread), keeping its result or its exception."""
        self._started.release()
        try:
            self._value = self._fn(*self._args)
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits for it
            self._error = exc
        finally:
            self._done.release()

    def result(self) -> T:
        """The call's return value, or its exception raised here."""
        with self._done:
            pass
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]


class SideThread:
    """A thread that runs submitted calls one at a time, in the order submitted.

    Started with `_thread`, not `threading.Thread`: `Thread.start` waits until the new
    thread runs, which in a fresh process costs about what hashing a megabyte does; this
    one gets going while the caller reads."""

    __slots__ = ("_ended", "_jobs")

    def __init__(self) -> None:
        self._jobs: SimpleQueue[Job[Any] | None] = SimpleQueue()
        self._ended = threading.Lock()  # released by the thread as it ends
        self._ended.acquire()
        _thread.start_new_thread(self._run, ())

    def submit(self, fn: Callable[..., T], *args: Any, wait: bool = True) -> Job[T]:
        """Run `fn(*args)` on the thread after the calls submitted before it; returns
        when it starts (the caller waits without the GIL, so the thread takes it), or at
        once with `wait=False`, for a caller about to release the GIL anyway (a read, in
        which the thread takes it): the wait for a thread to wake costs ~0.2 ms."""
        job = Job(fn, args)
        self._jobs.put(job)
        if wait:
            with job._started:
                pass
        return job

    def close(self) -> None:
        """Finish the calls submitted, then end the thread."""
        self._jobs.put(None)
        with self._ended:
            pass

    def _run(self) -> None:
        jobs = self._jobs
        try:
            while (job := jobs.get()) is not None:
                job.run()
        finally:
            self._ended.release()


def start_side_thread() -> SideThread | None:
    """A new side thread, or None where none can be started (a process at its thread
    limit): the caller then does the work itself, as it would without one."""
    try:
        return SideThread()
    except RuntimeError:  # "can't start new thread"
        return None
