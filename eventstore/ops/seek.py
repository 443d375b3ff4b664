"""Lines of the live log found by their seq, without reading the log (`events_by_seq`):
on a file, each probe a small read; on an engine that reads lines by seq (`SeqEngine`,
PostgreSQL, Redis), the lines asked for together in one read.

On a file, a line's seq is the second field of its envelope (`{"type":"<tag>","seq":<n>,`), and
seqs grow by one a line, so the line of a seq lies between the two known line starts
whose seqs bracket it. A probe reads from a byte between them up to the first line
start after it (the byte after a newline: JSON escapes every newline inside a line) and
reads that line's seq: from the middle of the range when the seq is far from both ends
(so lines of any lengths halve it), else from the nearer end, twice as far each time
(a delta chain's next link is a line or two before the last); a range of 16 KiB is read
whole. Every line start a read shows is kept for the next seq asked, so a seq costs a
few probes of a log of any length. Each line returned is checked against the link
before it, as a fold checks it (`eventstore.ops.paging.line_checks`; a `SeqEngine`
reads the `h` ending the line before each with it). It does no I/O of its own: it
reads through the engine's `live_view` (a `RangedEngine`, one consistent committed log)
or its `lines_at`.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

from eventstore.core.session_core import CoreOwner, SessionCore, core_of
from eventstore.engines.base import RangedEngine, SeqEngine
from eventstore.format.chain import SNAPSHOT_OPEN, chains_to, link_before
from eventstore.format.codec import EventCodec
from eventstore.format.crypt import encrypted_key_id
from eventstore.format.events import Event
from eventstore.ops.paging import SpanReader, line_checks

__all__ = ["EventAt", "can_seek", "events_by_seq"]

_ENVELOPE = re.compile(rb'\{"type":"[^"\\]*","seq":([0-9]{1,19}),')
_PROBE = 4096  # bytes a probe reads first (a page: a line start or a few are in it)
_SPAN = 16 * 1024  # known line starts this close: one read of all the bytes between
_NEAR = 4  # a seq this few lines from a known line start is probed for from there


class _Finder:
    """Known line starts of one committed log (`seqs[i]` starts at `offs[i]`; the last
    entry is the log's end, as the start of the seq after the head's)."""

    def __init__(self, read_span: SpanReader, size: int, first: int, last: int) -> None:
        self._read_span = read_span
        self.seqs = [first, last + 1]
        self.offs = [0, size]
        self._seen = (0, b"")  # the last span read: lines found in it are not read again

    def read_span(self, start: int, end: int) -> bytes:
        """Bytes [start, end) of the log, from the last span read when it holds them."""
        at, data = self._seen
        if at <= start and end <= at + len(data):
            return data[start - at : end - at]
        data = self._read_span(start, end)
        if end - start > len(self._seen[1]) // 2:  # keep the larger reads (a search's)
            self._seen = (start, data)
        return data

    def line(self, seq: int) -> tuple[int, bytes] | None:
        """(offset, the line without its newline) of `seq`; None if the log has none."""
        start = self._start(seq)
        if start is None:
            return None
        i = bisect_right(self.seqs, seq)
        if self.seqs[i] == seq + 1:
            return start, self.read_span(start, self.offs[i] - 1)
        end = self._line_start_after(start + 1, self.offs[i])
        if end is None:
            return None
        line_end, found = end
        if found != seq + 1 or not self._keep(found, line_end):
            return None
        return start, self.read_span(start, line_end - 1)

    def _start(self, seq: int) -> int | None:
        """The offset of the line of `seq`: a probe halves the range between the known
        line starts around it (lines of any lengths), or, a few lines from one of them
        (as a delta chain's next link is), probes from there, twice as far each time."""
        side, step = None, _PROBE
        while True:
            i = bisect_right(self.seqs, seq)
            if i == 0 or i == len(self.seqs):
                return None
            lo_seq, lo, hi_seq, hi = self.seqs[i - 1], self.offs[i - 1], self.seqs[i], self.offs[i]
            if lo_seq == seq:
                return lo
            if hi - lo <= _SPAN:  # close: one read shows every line start between
                if not self._read_starts(lo, hi):
                    return None  # none: the seq is not there
                continue
            back = hi_seq - seq <= seq - lo_seq
            if min(seq - lo_seq, hi_seq - seq) > _NEAR:
                side, at = None, (lo + hi) // 2  # far from both: halve the range
            else:  # a few lines away: probe from there, twice as far each time
                if side is not back:
                    side, step = back, _PROBE
                at = max(lo + 1, hi - step) if back else min(hi - 1, lo + step)
                step *= 2
            got = self._line_start_after(at, hi)
            if got is None and back and side is not None and at > lo + 1:
                continue  # `at` fell in the last line before `hi`: probe further back
            if got is None and at > lo + 1:
                got = self._line_start_after(lo + 1, hi)  # the line after `lo`'s
            if got is None:
                return None  # no line start between: the seq is not there
            if not lo_seq < got[1] < hi_seq or not self._keep(got[1], got[0]):
                return None  # no line where the seqs say one is: not a log this can read

    def _keep(self, seq: int, offset: int) -> bool:
        """Keep a line start found; whether it was new and fits those known (the seqs of
        a log this can read grow with their offsets)."""
        i = bisect_left(self.seqs, seq)
        if i < len(self.seqs) and self.seqs[i] == seq:
            return False
        if i == 0 or i == len(self.seqs) or not self.offs[i - 1] < offset < self.offs[i]:
            return False
        self.seqs.insert(i, seq)
        self.offs.insert(i, offset)
        return True

    def _read_starts(self, start: int, end: int) -> bool:
        """Keep every line start the bytes [start, end) show (each after a newline, with
        its whole envelope); whether one was new."""
        data = self.read_span(start, end)
        nl, new = data.find(b"\n"), False
        while 0 <= nl < len(data) - 1:
            m = _ENVELOPE.match(data, nl + 1)
            if m is None:
                break  # the envelope runs past the bytes read
            new = self._keep(int(m.group(1)), start + nl + 1) or new
            nl = data.find(b"\n", nl + 1)
        return new

    def _line_start_after(self, pos: int, end: int) -> tuple[int, int] | None:
        """(offset, seq) of the first line starting at or after `pos` and before `end`;
        every other line start the bytes read show is kept too."""
        n = _PROBE
        at = pos - 1  # a line starts at `pos` if the byte before it is a newline
        while at < end - 1:
            data = self.read_span(at, min(end, at + n))
            if not data:
                return None
            nl = data.find(b"\n")
            if nl >= 0:
                return self._starts_in(data, at, nl, end)
            at += len(data)
            n *= 2  # inside a long line: read further at a time
        return None

    def _starts_in(self, data: bytes, at: int, nl: int, end: int) -> tuple[int, int] | None:
        """The first line start after the newline at `data[nl]` (`data` read from byte
        `at`), with the others in `data` kept; None if it is `end` or not a line."""
        start = at + nl + 1
        if start >= end:
            return None
        head = data[nl + 1 : nl + 65]
        if len(head) < 64:
            head = self.read_span(start, min(end, start + 64))
        m = _ENVELOPE.match(head)
        if m is None:
            return None
        first = (start, int(m.group(1)))
        while True:  # the later line starts this read holds, whole envelopes only
            nl = data.find(b"\n", nl + 1)
            if nl < 0 or at + nl + 1 >= end:
                return first
            m = _ENVELOPE.match(data, nl + 1)
            if m is None or not self._keep(int(m.group(1)), at + nl + 1):
                return first


class EventAt:
    """`event_at(seq)`: the event of that seq, checked; None when it cannot be told (no
    such line in the live log, a line that does not check, an encrypted line, or one not
    of the types asked). A line asked for twice is read once."""

    def __init__(self, read: Callable[[list[int]], dict[int, Event | None]]) -> None:
        self._read = read
        self._found: dict[int, Event | None] = {}

    def want(self, seqs: Iterable[int]) -> None:
        """Read the lines of `seqs` together now, ahead of asking for them: one round
        trip on an engine that reads lines by seq (`SeqEngine`)."""
        missing = [s for s in dict.fromkeys(seqs) if s not in self._found]
        if missing:
            self._found.update(self._read(missing))

    def __call__(self, seq: int) -> Event | None:
        if seq not in self._found:
            self.want((seq,))
        return self._found[seq]


def can_seek(core: CoreOwner) -> bool:
    """Whether `events_by_seq` can read the store's lines by seq (its engine reads byte
    ranges or lines by seq); a log opening with a snapshot it still cannot."""
    return isinstance(core_of(core).engine, RangedEngine | SeqEngine)


@contextmanager
def events_by_seq(
    core: CoreOwner, session_id: str, tags: frozenset[str]
) -> Iterator[EventAt | None]:
    """An `EventAt` over the session's committed live log as it is now, for lines of
    types `tags`: on a `RangedEngine`, one consistent view held while the block runs;
    on a `SeqEngine`, each `want` one consistent read. None for another engine, or a
    log a snapshot opens (its lines before it are archived)."""
    core = core_of(core)
    engine = core.engine
    starts = tuple(b'{"type":"' + tag.encode() + b'",' for tag in sorted(tags))
    if isinstance(engine, RangedEngine):
        with _found_in_view(core, engine, session_id, starts) as read:
            yield None if read is None else EventAt(read)
    elif isinstance(engine, SeqEngine):
        sid = core.session(session_id).session_id
        yield EventAt(lambda seqs: _queried(core.codec, engine, sid, seqs, starts))
    else:
        yield None


@contextmanager
def _found_in_view(
    core: SessionCore, engine: RangedEngine, session_id: str, starts: tuple[bytes, ...]
) -> Iterator[Callable[[list[int]], dict[int, Event | None]] | None]:
    """A reader of events by seq over a live view of the log, one probe at a time."""
    sess = core.session(session_id)
    with engine.live_view(sess.session_id) as view:
        read_span, size = view.read_span, view.head.size
        opening = read_span(0, min(size, 64))
        first = _ENVELOPE.match(opening)
        if first is None or opening.startswith(SNAPSHOT_OPEN):
            yield None
            return
        finder = _Finder(read_span, size, int(first.group(1)), view.head.seq)
        codec, where = core.codec, view.where
        yield lambda seqs: {s: _checked_event(codec, finder, s, starts, where) for s in seqs}


def _checked_event(
    codec: EventCodec, finder: _Finder, seq: int, starts: tuple[bytes, ...], where: str
) -> Event | None:
    """The event of the line of `seq`, if it is of one of the types `starts` names and
    checks against the link before it."""
    got = finder.line(seq)
    if got is None:
        return None
    offset, line = got
    if not line.startswith(starts) or not line_checks(finder.read_span, offset, line):
        return None
    return _decoded(codec, seq, offset, line, where)


def _queried(
    codec: EventCodec, engine: SeqEngine, sid: str, seqs: list[int], starts: tuple[bytes, ...]
) -> dict[int, Event | None]:
    """The events of `seqs` from one read of their lines by seq, each checked against
    the link the engine read before it."""
    lines = engine.lines_at(sid, seqs)
    where = engine.where(sid)
    found: dict[int, Event | None] = dict.fromkeys(seqs)
    for seq, got in lines.items():
        link = link_before(got.before)
        ok = link is not None and got.line.startswith(starts) and chains_to(link, got.line)
        if ok and seq in found:
            found[seq] = _decoded(codec, seq, got.offset, got.line, where)
    return found


def _decoded(codec: EventCodec, seq: int, offset: int, line: bytes, where: str) -> Event | None:
    """The event of a checked line, if it is the line of `seq` and plain (an encrypted
    one is read by a fold, which holds its key)."""
    if encrypted_key_id(line) is not None:
        return None
    ev = codec.decode_line(line, offset, where)
    return ev if ev.seq == seq else None
