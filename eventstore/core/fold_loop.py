"""The fold loop: a projection's state advanced over the live log, piece by piece.

An engine that can hands the log over in pieces (`Engine.read_some`), so a long log is
never all in memory at once. A fold from the start may trust a checked prefix
(`eventstore.core.checked_prefix`): its bytes are folded without per-line hashes while
they are hashed (on a side thread for long pieces), and nothing folded from them is kept
unless the digest proves them; otherwise `PrefixMismatch` makes the caller fold again,
checking every line.
"""

from __future__ import annotations

from typing import Any

import msgspec

from eventstore.core import checked_prefix
from eventstore.core.cache_policy import CachePolicy
from eventstore.core.folding import fold_events
from eventstore.core.sessions import Fold, SessionState
from eventstore.core.side_thread import SideThread, start_side_thread
from eventstore.core.tuning import Tuning
from eventstore.engines.base import EMPTY_HEAD, Engine, ReadResult
from eventstore.format.codec import EventCodec
from eventstore.format.reader import read_lines
from projections import Projection

__all__ = ["FoldContext", "PrefixMismatch", "fold_log"]


class FoldContext(msgspec.Struct, frozen=True):
    """What a fold reads with: the engine, the codec, the sizes, and the cache policy
    (whether checked prefixes are kept: `caches.marks`)."""

    engine: Engine
    codec: EventCodec
    tuning: Tuning
    caches: CachePolicy


class PrefixMismatch(Exception):
    """A checked prefix did not prove the bytes a load trusted: fold again, checking."""


class _Pass:
    """One fold pass's running state: the prefix being grown and the bytes still to
    prove (`trusted`: the end of the mark's bytes; 0 once proven or without a mark)."""

    __slots__ = ("folded", "grow", "mark", "side", "trusted")

    def __init__(
        self, mark: checked_prefix.Mark | None, grow: checked_prefix.Prefix | None
    ) -> None:
        self.mark = mark
        self.grow = grow
        self.side: SideThread | None = None
        self.trusted = mark.size if mark is not None else 0
        self.folded = 0


def fold_log(
    core: FoldContext,
    sess: SessionState,
    proj: Projection[Any],
    f: Fold,
    mark: checked_prefix.Mark | None,
) -> int:
    """Fold the log after `f.head` into `f`; returns how many bytes it folded.

    With `mark` (a fold from the start), the first `mark.size` bytes are folded without
    per-line hashes while they are hashed; a mismatch raises PrefixMismatch (the caller
    discards the fold). The session's checked prefix grows with what this fold checks,
    when the fold starts where it ends (or at the start)."""
    marks = core.caches.marks
    grow = None
    if marks:
        p = sess.prefix
        if f.head.position is None:
            grow = checked_prefix.Prefix()
        elif p is not None and p.head.position == f.head.position:
            grow = p
    run = _Pass(mark, grow)
    # hashes the checked prefix while this thread decodes; started before the first read,
    # so it is ready by the time the first piece is
    side = run.side = start_side_thread() if run.trusted >= core.tuning.hash_aside else None
    sid = sess.session_id
    piece_size = core.tuning.read_piece
    # the log after a fold cache, read with it, is taken once, by the fold that follows
    ahead, f.read_on = f.read_on, None
    piece: tuple[ReadResult, bool] | None = (
        (ahead, False)
        if ahead is not None
        else core.engine.read_some(sid, f.head.position, piece_size)
    )
    try:
        while piece is not None:
            res, more = piece
            if res.reset:
                if run.trusted:
                    raise PrefixMismatch("the log was replaced during the load")
                f.state, f.head = proj.initial(), EMPTY_HEAD
                run.folded = 0
                run.grow = checked_prefix.Prefix() if marks else None
            # the next piece (from where this one ends) is read before this one is
            # decoded: the side thread starts hashing meanwhile
            piece = _fold_piece(core, sess, proj, f, run, res, more)
    finally:
        if side is not None:
            side.close()
    if run.trusted:
        raise PrefixMismatch("the log ends before the prefix does")
    grow = run.grow
    if grow is not None and grow.size and (sess.prefix is None or grow.size >= sess.prefix.size):
        sess.prefix = grow
    return run.folded


def _fold_piece(
    core: FoldContext,
    sess: SessionState,
    proj: Projection[Any],
    f: Fold,
    run: _Pass,
    res: ReadResult,
    more: bool,
) -> tuple[ReadResult, bool] | None:
    """Fold one piece `res` into `f` (its first bytes proven by the mark, the rest
    checked line by line); returns the next piece, read before this one is decoded."""
    codec = core.codec
    sid = sess.session_id
    data = res.data
    seq, link = f.head.seq, f.head.link
    split = min(len(data), max(0, run.trusted - res.offset))  # bytes of it to prove
    part = data if split == len(data) else data[:split]
    hashed = None
    if split:
        assert run.mark is not None and run.grow is not None
        end_head = res.head if split == len(data) else run.mark.head
        if run.side is not None and split >= core.tuning.hash_aside:
            # a read follows: it hands the side thread the GIL
            hashed = run.side.submit(run.grow.extend, part, end_head, wait=not more)
        else:
            run.grow.extend(part, end_head)
    nxt = core.engine.read_some(sid, res.head.position, core.tuning.read_piece) if more else None
    if split:
        assert run.mark is not None and run.grow is not None
        lines = read_lines(
            part, codec, codec.decoder(proj.event_types), res.where,
            offset=res.offset, seq=seq, link=link, hashes_checked=True,
        )  # fmt: skip
        if lines.end != len(part):
            raise PrefixMismatch("the prefix does not end with a whole batch")
        # folded while the side thread hashes (a snapshot's states decode then): nothing
        # is kept unless the digest below proves the bytes
        f.state = fold_events(codec, core.engine, sid, proj, f.state, lines.events, res.where)
        if hashed is not None:
            hashed.result()
        run.folded += split
        assert lines.seq is not None and lines.link is not None  # given seq, link
        seq, link = lines.seq, lines.link
        if res.offset + split == run.trusted:
            mark = run.mark
            proven = run.grow.mark().digest == mark.digest
            if not proven or (seq, lines.h) != (mark.head.seq, mark.head.h):
                raise PrefixMismatch("the digest or the last line differs")
            run.trusted = 0  # proven: the rest is checked line by line
            run.grow.saved = mark.saved  # (what the engine keeps needs no rewrite)
    if split < len(data):
        rest = data if not split else data[split:]
        lines = read_lines(
            rest, codec, codec.decoder(proj.event_types), res.where,
            offset=res.offset + split, seq=seq, link=link,
        )  # fmt: skip
        f.state = fold_events(codec, core.engine, sid, proj, f.state, lines.events, res.where)
        run.folded += len(rest)
        if run.grow is not None:
            run.grow.extend(rest, res.head)
    f.head = res.head  # the state and its head advance together, piece by piece
    sess.head = res.head
    return nxt
