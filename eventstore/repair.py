"""`repair`: make a session's live log trustworthy again, explicitly, under the writers'
exclusion. Never automatic, and it never destroys a byte.

The live log is read by the one line reader with a prefix-keeping reporter: reading
stops at the first error, and what is kept is the committed batches before it. A torn
tail is cut off; a log with a bad line keeps its valid prefix. Either way the engine
saves the whole original aside first (`RepairHold.keep_prefix`: for the file engine a
hard link `<log>.torn-<UTC time>` or `<log>.corrupt-<UTC time>`, so there is never a
moment without a log). Archived history is never changed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import msgspec

from .errors import UnknownSessionError
from .log import Prefix, Problem, read_lines

if TYPE_CHECKING:
    from .store import SessionStore

__all__ = ["RepairReport", "repair"]


class RepairReport(msgspec.Struct):
    """What `repair` did. `action`: "none" (nothing to do), "truncated" (a torn tail was
    cut off) or "moved_aside" (the log had a bad line and keeps its valid prefix). Either
    change first saved the whole original at `moved_to`."""

    session_id: str
    action: Literal["none", "truncated", "moved_aside"]
    log: str
    moved_to: str | None
    kept_events: int
    kept_bytes: int
    dropped_bytes: int
    problem: Problem | None
    message: str


def repair(store: SessionStore, session_id: str) -> RepairReport:
    """Cut a torn tail, or keep the committed batches before the first bad line; the
    original is saved aside first (see the module docstring). UnknownSessionError if the
    session has no live log."""
    sess = store._session(session_id)
    codec = store.codec
    with sess.lock, store.engine.hold(session_id) as hold:
        buf = hold.data
        if not buf:
            raise UnknownSessionError(f"session {session_id!r} has no live log to repair")
        where = hold.where
        reporter = Prefix()
        kept = read_lines(buf, codec, codec.decoder(frozenset()), where, reporter=reporter)
        torn = [p for p in reporter.warnings if p.kind in ("torn_tail", "torn_batch")]
        bad = reporter.error
        cut = kept.end
        n = len(kept.events)
        if bad is None and not torn:
            return RepairReport(
                session_id, "none", where, None, n, len(buf), 0, None,
                "the log is intact; nothing to do",
            )  # fmt: skip
        saved = hold.keep_prefix(cut, "torn" if bad is None else "corrupt")
        sess.folds.clear()
        sess.head = None
    dropped = len(buf) - cut
    if bad is None:
        return RepairReport(
            session_id, "truncated", where, saved, n, cut, dropped, torn[0],
            f"truncated a torn tail of {dropped} bytes at byte {cut} (saved to {saved})",
        )  # fmt: skip
    return RepairReport(
        session_id, "moved_aside", where, saved, n, cut, dropped, bad,
        f"{bad.kind} at byte {bad.offset} (seq {bad.seq}): kept {n} events"
        f" ({cut} bytes) before it; the original is at {saved}",
    )  # fmt: skip
