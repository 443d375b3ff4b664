"""What the session core keeps per session, and the bounded table that holds it.

A session's state is its folded projections (each with the head it was folded to), the
last head this process saw, and the checked prefix of its live log this process can
vouch for (`eventstore.core.checked_prefix`). `SessionTable.forget` is the one way to
drop it (a session removed, repaired or compacted by this store), and a forked child
starts every session afresh (`reset_after_fork`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from eventstore.core import checked_prefix
from eventstore.engines.base import ColdStart, Head, ReadResult

__all__ = ["Fold", "SessionState", "SessionTable"]


class Fold:
    """One projection's state of one session and the head it was folded to. `saved`: the
    head the persistent fold cache holds, as far as this process knows (None: unknown),
    so a cache is written only when it would hold something new; `saved_bytes`: how
    many bytes that cache took (0: unknown), what a writer's next save costs about.
    `chunks`: the chunk caches holding complete frames of `state`
    (`eventstore.core.fold_cache.Chunks`; they say themselves whether they are still of
    the current state object). `read_on`: the log after `head`, read with the fold cache
    it came from (`CacheReader.read_on`), or the log from its start read with a missed
    cache, for the fold that follows at once. `cold`: what the engine found for a fold
    from the start when no cache was (`CachingEngine.open_cold`: the checked prefix),
    taken by that fold. `due`: what a writer's last look at this fold's cache found
    not yet due (`CachePolicy.keep_current`; None: no look since it was saved)."""

    __slots__ = ("chunks", "cold", "due", "head", "read_on", "saved", "saved_bytes", "state")

    def __init__(
        self, state: Any, head: Head, saved: Head | None = None, chunks: Any = None
    ) -> None:
        self.state = state
        self.head = head
        self.saved = saved
        self.saved_bytes = 0
        self.due: tuple[Head | None, int, int, int] | None = None
        self.chunks = chunks
        self.read_on: ReadResult | None = None
        self.cold: ColdStart | None = None


class SessionState:
    """What the core keeps for one session (see the module docstring)."""

    __slots__ = (
        "auto_floor",
        "checked_snapshots",
        "folds",
        "head",
        "kept_from_creation",
        "lock",
        "prefix",
        "session_id",
    )

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.lock = threading.RLock()
        self.folds: dict[str, Fold] = {}
        self.head: Head | None = None  # the newest head this process saw (may be stale)
        self.prefix: checked_prefix.Prefix | None = None
        # snapshot lines a cold page checked whole: by `h`, the digests of the blocks
        # its cut read (eventstore.ops.paging)
        self.checked_snapshots: dict[bytes, dict[int, bytes]] = {}
        # after an automatic compaction skipped as not shrinking: the live log it read
        # (its first seq) and twice its size, below which it is not tried again
        self.auto_floor = (0, 0)
        # log bytes folded into the states this store started when it created the session
        # (counted against Tuning.kept_from_creation); -1: none kept that way
        self.kept_from_creation = -1

    def forget(self) -> None:
        """Drop every folded state and what was vouched for: the next use refolds."""
        self.folds = {}
        self.head = None
        self.prefix = None
        self.checked_snapshots = {}
        self.kept_from_creation = -1


class SessionTable:
    """The sessions a core keeps, at most `limit`, the oldest opened dropped first
    (handed to `on_drop`, outside the table's lock, to save their caches)."""

    def __init__(self, limit: int, on_drop: Callable[[SessionState], None]) -> None:
        self.limit = limit
        self._on_drop = on_drop
        # by session id, oldest opened first; the core reads it directly on its hot path
        self.by_id: dict[str, SessionState] = {}
        self._guard = threading.Lock()

    def __len__(self) -> int:
        return len(self.by_id)

    def get(self, session_id: str) -> SessionState | None:
        """The session's state if kept (no id check: a lookup of a kept id)."""
        try:
            return self.by_id.get(session_id)
        except TypeError:  # unhashable, so not a str: the caller's validation says so
            return None

    def open(self, session_id: str) -> SessionState:
        """The session's state, made if missing (the id was validated by the caller)."""
        with self._guard:
            sess = self.by_id.get(session_id)
            if sess is not None:
                return sess
            sess = self.by_id[session_id] = SessionState(session_id)
            excess = len(self.by_id) - self.limit
            # the oldest opened go first; a thread still using one keeps it
            dropped = [self.by_id.pop(k) for k in list(self.by_id)[:excess]] if excess > 0 else []
        for old in dropped:
            self._on_drop(old)
        return sess

    def take_all(self) -> list[SessionState]:
        """Every kept session, no longer kept (close)."""
        with self._guard:
            sessions = list(self.by_id.values())
            self.by_id.clear()
        return sessions

    def reset_after_fork(self) -> None:
        """A forked child: fresh locks, and every session refolds from the engine (a
        thread of the parent may have been between changing a state and its head)."""
        self._guard = threading.Lock()
        for sess in list(self.by_id.values()):
            sess.lock = threading.RLock()
            sess.forget()
