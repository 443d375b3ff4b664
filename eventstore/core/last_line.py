"""A first fold from the log's last line alone, for projections whose state only that
line decides.

The lifecycle projection is one: a tombstone always ends its log (no write lands after
it, and `restore` removes the session), so whether a session is deleted is said by its
last line. A projection says so with `last_line_only = True`; its first fold in a process
reads the last line and folds it alone, instead of the whole log: every write folds
the lifecycle projection, and a first write to a long session would otherwise read all
of it. An engine that reads byte ranges (`RangedEngine`) gives the line from the end
back to the newline before it; one that reads lines by seq (`SeqEngine`: PostgreSQL,
Redis) gives the head and its line in one read (`SeqEngine.tail`), which must be the
head's line (its `h`); an empty log is a fold at the empty head with nothing to read.
Either way the line must check against the link before it, as a fold checks it.
Anything unexpected (no newline found, a line that does not decode or check, a log that
changed between the two reads) answers None, and the caller folds from the start as
usual. The fold is as fresh as that read: the catch-up that follows reads nothing more.
A reader of a log's newest lines by seq has that line with its head already
(`SessionCore.seed_from_tail` judges from it through `head_line`, with the same checks).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from eventstore.core.sessions import Fold
from eventstore.engines.base import (
    EMPTY_HEAD,
    ColdStart,
    Engine,
    Head,
    RangedEngine,
    ReadResult,
    SeqEngine,
    SeqLine,
)
from eventstore.errors import EventStoreError
from eventstore.format.chain import chains_to, link_at, link_before
from eventstore.format.codec import EventCodec
from eventstore.format.events import Event, Snapshot
from projections import Projection, fold

__all__ = ["fold_of_last_line", "head_line", "last_line_fold", "last_line_only"]

_STEP = 4096  # bytes read at a time, backwards from the end (doubling)


def last_line_only(proj: Projection[Any]) -> bool:
    """Whether `proj` declares that the last line alone decides its state."""
    return getattr(proj, "last_line_only", False) is True


def last_line_fold(
    engine: Engine, codec: EventCodec, session_id: str, proj: Projection[Any]
) -> Fold | None:
    """`proj` folded over the live log's last committed line, at the log's head; None
    when the log is empty, the engine reads neither byte ranges nor lines by seq, or
    the line cannot be read that way (fold from the start)."""
    found: tuple[Event | None, Head, str] | None
    if isinstance(engine, RangedEngine):
        found = _last_of_view(engine, codec, session_id)
    elif isinstance(engine, SeqEngine):
        found = _last_by_seq(engine, codec, session_id)
    else:
        return None
    if found is None:
        return None
    ev, head, where = found
    # the log after `head` was read with it (nothing: `head` ends it): the fold that
    # follows takes that instead of reading again (a write then appends only at `head`,
    # and a load answers as of this read, made during its call)
    after = ReadResult(b"", head, False, where, head.size)
    if ev is None:  # an empty log: nothing to fold, no checked prefix to look for
        f = Fold(proj.initial(), head)
        f.cold = ColdStart(None, None, after)
        f.read_on = after
        return f
    seeded = fold_of_last_line(proj, ev, head)
    if seeded is not None:
        seeded.read_on = after
    return seeded


def fold_of_last_line(proj: Projection[Any], ev: Event, head: Head) -> Fold | None:
    """`proj` folded over `ev` alone, the last line of the log at `head` (None: not the
    line of the head's seq, or one the projection refuses: fold from the start)."""
    if ev.seq != head.seq:
        return None  # (a batch's last line carries the head's seq; anything else: refold)
    try:
        return Fold(fold(proj, proj.initial(), [ev]), head)
    except EventStoreError:
        return None


def _last_of_view(
    engine: RangedEngine, codec: EventCodec, session_id: str
) -> tuple[Event, Head, str] | None:
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
        offset = start + nl + 1
        try:
            ev = codec.decode_line(line, offset, view.where)
        except EventStoreError:
            return None
        # the line alone decides the state: it must check against its link as a fold
        # checks it (an edited tombstone, or a live line edited over one, is then left
        # to the fold, which reports it). A line right after an opening snapshot chains
        # to its `base_h`, not to the `h` ending it: that one is folded too
        if offset == 0 and isinstance(ev, Snapshot):
            link: str | None = ev.base_h
        else:
            link = link_at(view.read_span, offset)
        return (ev, head, view.where) if link is not None and chains_to(link, line) else None


def _last_by_seq(
    engine: SeqEngine, codec: EventCodec, session_id: str
) -> tuple[Event | None, Head, str] | None:
    """The last line and the head, read together; (None, the empty head) for an empty
    log."""
    head, lines = engine.tail(session_id, 1)
    where = engine.where(session_id)
    if head.seq == 0:
        return (None, EMPTY_HEAD, where) if head == EMPTY_HEAD else None
    ev = head_line(codec, where, head, lines)
    return None if ev is None else (ev, head, where)


def head_line(
    codec: EventCodec, where: str, head: Head, lines: Mapping[int, SeqLine]
) -> Event | None:
    """The event of the head's line among `lines`, read with `head` in one read
    (`SeqEngine.tail`), if it is that line and checks against the link before it, as a
    fold checks it; None otherwise (fold from the start, which reports what is wrong)."""
    got = lines.get(head.seq)
    if got is None or got.line[-18:-2] != head.h.encode() or head.link != head.h:
        # (no line of that seq: a snapshot; another line: the log changed; a link that
        # is not the line's h: a head edited, which the fold reports)
        return None
    link = link_before(got.before)
    if link is None or not chains_to(link, got.line):
        return None
    try:
        return codec.decode_line(got.line, got.offset, where)
    except EventStoreError:
        return None
