"""Appends' session index rows waiting to be written, and the thread that writes them.

The file engine writes a session's index row at once only where a page must find it:
the session's creation and a change of its labels. Any other append leaves its row (the
newest per session) here, written by the first of: a page from the same engine (which
lists this process's own writes as they are), `close`, or a timer thread that writes
whatever waits `INDEX_LAG` seconds after the first of it arrived. So no such append
waits for the index (a fresh process's first append to a session would otherwise open
SQLite and make its write-ahead log: ~1 ms), a burst of appends costs one index write,
and another process's page sees a row at most about a second behind while this one
lives. A process that exits without `close` writes what waits at its exit (an `atexit`
hook: the thread is a daemon, which never holds up an exit, and dies where it is),
waiting at most `EXIT_WAIT` in all (however many stores) for an index another process
holds locked (or for a thread's write, held up so), then leaving the index stale instead; one
that cannot start the thread (at its thread limit; from Python 3.12, in an `atexit`
handler) writes the row at once. The index is a cache of the logs: a row lost with a
killed process is corrected when a page reaches it.
"""

from __future__ import annotations

import atexit
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from eventstore.logger import log

__all__ = ["EXIT_WAIT", "INDEX_LAG", "LaggingRows"]

INDEX_LAG = 1.0
"""Seconds an append's row may wait before the timer thread writes it (read each time
the timer starts)."""

EXIT_WAIT = 0.25
"""Seconds a process's exit waits in all (however many stores it has open) for the
index (another process's lock on it, or a thread's write held up by one) before it
leaves the index stale: the next page rebuilds it from the logs. Short, as the rows are
only a cache of the logs: an exit should not wait out SQLite's busy timeout (10 s) for
them, while the thread and `close` do (a refused write costs the next page a rebuild)."""

V = TypeVar("V")

# every LaggingRows alive, for the exit hook (weak: a store let go is not kept)
_alive: weakref.WeakSet[LaggingRows[Any]] = weakref.WeakSet()


class LaggingRows(Generic[V]):
    """The rows waiting, one per session (`V`: what the row is made of, made only when
    written: most are replaced unwritten), and at most one timer thread. `write` takes
    the waiting (session id, value) pairs and how long to wait for a locked index (None:
    the index's own wait), and never raises for a refused index (it leaves the index
    stale); `abandon(why)` leaves the index stale where rows are not written at exit."""

    def __init__(
        self,
        write: Callable[[list[tuple[str, V]], float | None], None],
        abandon: Callable[[str], None],
    ) -> None:
        self._write = write
        self._abandon = abandon
        self._guard = threading.Lock()
        # one flush at a time: two writing at once could land an older row last
        self._writing = threading.Lock()
        self._waiting: dict[str, V] = {}
        self._timer: threading.Timer | None = None
        _alive.add(self)

    def reset_after_fork(self) -> None:
        """In a forked child: the parent's rows are the parent's to write, and its
        timer thread does not exist here."""
        self._guard = threading.Lock()
        self._writing = threading.Lock()
        self._waiting = {}
        self._timer = None

    def add(self, session_id: str, value: V) -> None:
        """Let `value` wait as the session's row (replacing one waiting)."""
        with self._guard:
            self._waiting[session_id] = value
            if self._timer is None:
                self._timer = self._started()
            if self._timer is not None:
                return
        self.flush()  # no thread to be had: the row is written now

    def discard(self, session_id: str) -> None:
        """Forget the session's waiting row (the session is gone, or written at once),
        after a write in progress, which may hold it: written after the caller's own
        change of the row (a removal's drop), it would undo that change."""
        with self._writing, self._guard:
            self._waiting.pop(session_id, None)

    def flush(self, wait: float | None = None) -> None:
        """Write every waiting row now, waiting at most `wait` seconds (None: as long as
        the index waits) for the index, or for a write the thread is making; past it the
        index is left stale instead."""
        if not self._writing.acquire(timeout=-1 if wait is None else wait):
            self._abandon("the index's thread is held up writing rows")
            return
        try:
            with self._guard:
                rows = list(self._waiting.items())
                self._waiting.clear()
            if rows:
                self._write(rows, wait)
        finally:
            self._writing.release()

    def stop(self) -> None:
        """Stop the timer thread (waiting for a write it is making) and write what waits."""
        while True:
            with self._guard:
                timer = self._timer
            if timer is None:
                break
            timer.cancel()
            timer.join()
            with self._guard:
                if self._timer is timer:  # cancelled before it ran: nothing cleared it
                    self._timer = None
        self.flush()

    def _started(self) -> threading.Timer | None:
        """The timer thread, started; None when no thread can start (a process at its
        thread limit; from Python 3.12, in an `atexit` handler)."""
        timer = threading.Timer(INDEX_LAG, self._on_time)
        timer.daemon = True  # never holds a process's exit: what waits is only a cache
        timer.name = "eventstore-index"
        try:
            timer.start()
        except RuntimeError as exc:
            log.debug("eventstore: the session index's thread did not start: %s", exc)
            return None
        return timer

    def _on_time(self) -> None:
        try:
            self.flush()
        except Exception as exc:  # no caller to tell: the rows stay stale until a page
            log.warning("eventstore: writing the session index's waiting rows: %s", exc)
        with self._guard:
            # rows added while this wrote: a thread of their own (or, none to be had,
            # they wait for the next add, page, close or exit)
            self._timer = self._started() if self._waiting else None


@atexit.register
def _flush_at_exit() -> None:
    """Write what waits in every store of a process exiting without `close`, all of them
    waiting at most `EXIT_WAIT` in all for the index (or a write a thread is making)."""
    # one deadline for the whole exit: each store waiting its own would hold an exit
    # with forty stores on a locked index for SQLite's ten seconds again
    deadline = time.monotonic() + EXIT_WAIT
    for rows in list(_alive):
        try:
            rows.flush(max(deadline - time.monotonic(), 0.0))
        except Exception as exc:  # the other stores still get theirs
            log.warning("eventstore: writing the session index's waiting rows at exit: %s", exc)
