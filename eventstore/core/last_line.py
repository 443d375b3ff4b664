"""A first fold from the log's last line alone, for projections whose state only that
line decides.

The lifecycle projection is one: a tombstone always ends its log (no write lands after
it, and `restore` removes the session), so whether a session is deleted is said by its
last line. A projection says so with `last_line_only = True`; on an engine that reads
byte ranges (`RangedEngine`), its first fold in a process reads the last line (from
the end, back to the newline before it) and folds it alone, instead of the whole log:
every write folds the lifecycle projection, and a first write to a long session would
otherwise read all of it. Anything unexpected (no newline found, a line that does not
decode) answers None, and the caller folds from the start as usual.
"""

from __future__ import annotations

from typing import Any

from eventstore.core.sessions import Fold
from eventstore.engines.base import RangedEngine
from eventstore.errors import EventStoreError
from eventstore.format.codec import EventCodec
from projections import Projection, fold

__all__ = ["last_line_fold", "last_line_only"]

_STEP = 4096  # bytes read at a time, backwards from the end (doubling)


def last_line_only(proj: Projection[Any]) -> bool:
    """Whether `proj` declares that the last line alone decides its state."""
    return getattr(proj, "last_line_only", False) is True


def last_line_fold(
    engine: RangedEngine, codec: EventCodec, session_id: str, proj: Projection[Any]
) -> Fold | None:
    """`proj` folded over the live log's last committed line, at the log's head; None
    when the log is empty or the line cannot be read that way (fold from the start)."""
    with engine.live_view(session_id) as view:
        head = view.head
        end = head.size
        if head.seq == 0 or end <= 0:
            return None
        step = _STEP
        while True:
            start = max(0, end - 1 - step)
            tail = view.read_span(start, end - 1)  # without the last line's newline
            nl = tail.rfind(b"\n")
            if nl >= 0 or start == 0:
                line = tail[nl + 1 :]
                break
            step *= 2
        try:
            ev = codec.decode_line(line, start + nl + 1, view.where)
        except EventStoreError:
            return None
    if ev.seq != head.seq:
        return None  # (a batch's last line carries the head's seq; anything else: refold)
    try:
        return Fold(fold(proj, proj.initial(), [ev]), head)
    except EventStoreError:
        return None
