"""Transcript paging: a page of messages for O(its size), not O(transcript); and the
newest events of any types read from the log's end the same way (`newest_events`).

Owns `SessionStore.load_transcript_messages(sid, start=, limit=, last=)`. Warm (the
store has folded the transcript before), a page is a slice of the folded state, brought
up to date first (O(what was appended since)); only the page is copied. Cold, `last=N`
is read from the end of the log (`last_messages`); `start` folds the transcript once
(then it is warm).

`last_messages` reads the committed live log backwards through a byte-range reader,
decodes only `messages_appended` lines (the others are recognised by their first bytes
and never decoded) and stops once it has N messages. If it reaches a compaction
snapshot first, it takes the missing messages from the end of the snapshot's transcript
entry, whose byte range the snapshot's `layout` gives, finding message boundaries
backwards (see `_suffix_messages`), so a compacted transcript of any length costs the
bytes of the messages returned. Every live line it passes (not only those whose
messages it returns: an edit of a line's type would hide it) has its `h` checked
against the link before it (the `h` ending the line before, the snapshot's
`base_h` right after it, "" at the start of the log), as a fold would check it: a line
that does not check, or an irregular one before it (a blank line), makes it return
None, and the caller folds, which checks every line and reports the first that fails.
Messages cut from a snapshot's entry are returned once the whole snapshot line checks
(the one read of it whole; the caller remembers the digests of the 16 KiB blocks the
cut read, and a later page cutting from those blocks checks each against them, so a
line changed since its check is never served from memory). It does no I/O of
its own: the caller (the core, over a `RangedEngine`'s `live_view`) passes
`read_span(start, end)` over one consistent live log whose committed size is `size` (a
torn tail lies past `size` and is never read).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Protocol

import msgspec

from eventstore.core.session_core import CoreOwner, SessionCore, core_of
from eventstore.engines.base import Head, RangedEngine, SeqEngine
from eventstore.errors import InvalidRecordError
from eventstore.format.chain import (
    LINE_END_LEN,
    SNAPSHOT_OPEN,
    chains_to,
    find_snapshot_head,
    link_at,
    link_before,
    link_ending,
)
from eventstore.format.codec import EventCodec
from eventstore.format.crypt import encrypted_key_id
from eventstore.format.events import (
    Event,
    MessagesAppended,
    SnapshotHead,
)
from eventstore.records import Message
from projections.transcript import copy_message

if TYPE_CHECKING:
    from eventstore.core.sessions import SessionState

__all__ = [
    "ByteSearch",
    "SpanReader",
    "last_messages",
    "line_checks",
    "lines_backward",
    "newest_events",
    "transcript_page",
]

#: `read_span(start, end)`: bytes [start, end) of the live log (end <= the committed size).
SpanReader = Callable[[int, int], bytes]

_MESSAGES = b'{"type":"messages_appended",'
# A tombstone resets every projection's state (`projections.fold`): a backward scan
# that meets one (a delete stopped before its erase leaves it ending the live log) has
# everything the fold would keep, whatever types it looks for
_TOMBSTONE = b'{"type":"session_deleted",'
_MESSAGES_TAG = frozenset({"messages_appended"})
_CHUNK = 64 * 1024
_message_list = msgspec.json.Decoder(list[Message])
# A message inside a transcript state: msgspec writes `role` first, and the quote after
# `{` cannot be an escaped one, so this only ever matches at an object's start (which
# may still be a nested object: see `_suffix_messages`).
_BOUNDARY = b',{"role":"'


def _count(name: str, value: object) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidRecordError(f"{name} must be None or an int >= 0, got {value!r}")
    return value


def transcript_page(
    core: CoreOwner,
    session_id: str,
    *,
    start: int | None = None,
    limit: int | None = None,
    last: int | None = None,
) -> list[Message]:
    """`messages[start:start + limit]`, or with `last` the newest `last` messages (see
    the module docstring for what each costs). The messages are the caller's own."""
    core = core_of(core)
    start, limit, last = _count("start", start), _count("limit", limit), _count("last", last)
    if last is not None and (start is not None or limit is not None):
        raise InvalidRecordError("give last=, or start= and/or limit=, not both")
    sess = core.session(session_id)
    if last is not None and not core.has_fold(session_id, "transcript"):
        page = _read_last_messages(core, sess, last)
        if page is not None:
            return page

    def cut(state: list[Message]) -> list[Message]:
        if last is not None:
            part = state[len(state) - last :] if last < len(state) else state
        else:
            first = start or 0
            part = state[first : None if limit is None else first + limit]
        return [copy_message(m) for m in part]

    return core.loaded(session_id, core.projections["transcript"], cut)


def _read_last_messages(core: SessionCore, sess: SessionState, n: int) -> list[Message] | None:
    """The newest `n` messages read from the end of the live log, through the engine's
    ranged view of it, or its lines read by seq (None: the engine has neither, or the
    log cannot be sliced; fold instead)."""
    engine = core.engine
    if isinstance(engine, SeqEngine):
        return _last_messages_by_seq(core, sess.session_id, n)
    if not isinstance(engine, RangedEngine):
        return None
    with engine.live_view(sess.session_id) as view:
        return last_messages(
            view.read_span, view.head.size, n, core.codec, view.where, sess.checked_snapshots
        )


def _last_messages_by_seq(core: SessionCore, session_id: str, n: int) -> list[Message] | None:
    """`last_messages` on an engine that reads lines by seq (`newest_events`); None
    when the messages wanted reach into a snapshot opening the log (fold instead)."""
    if n <= 0:
        return []
    found: list[list[Message]] = []  # newest batch first
    have = 0

    def visit(ev: Event) -> bool:
        nonlocal have
        if type(ev) is MessagesAppended and ev.messages:
            found.append(ev.messages)
            have += len(ev.messages)
        return have >= n

    head = newest_events(core, session_id, _MESSAGES_TAG, visit)
    return None if head is None else _newest(found, n)


def last_messages(
    read_span: SpanReader,
    size: int,
    n: int,
    codec: EventCodec,
    where: object = None,
    checked_snapshots: dict[bytes, dict[int, bytes]] | None = None,
) -> list[Message] | None:
    """The newest `n` messages of the log, oldest first; None if the log opens with a
    snapshot whose transcript this reader cannot slice, or any line it would return
    fails its hash check (the caller folds instead, which says what is wrong).

    `where` names the log in errors (a bad line raises CorruptLogError, as a fold would).
    Messages cut from an opening snapshot's entry are returned only once the whole
    snapshot line checks; `checked_snapshots` maps the `h` of each snapshot line a
    caller has checked whole before to the digests of the blocks its cut read (this
    call adds to it), so a later page that cuts from those blocks re-reads and checks
    them alone; any other cut, or a block changed since, checks the line whole again.
    """
    if n <= 0 or size <= 0:
        return []
    floor = 0  # the first byte after an opening snapshot line: where the scan stops
    snap: SnapshotHead | None = None
    if read_span(0, min(size, len(SNAPSHOT_OPEN))) == SNAPSHOT_OPEN:
        snap = _snapshot_header(read_span, size)
        if snap is None or snap.length <= 0:
            return None
        floor = snap.length + 1
    found: list[list[Message]] = []  # newest batch first
    have = 0
    for offset, line, data, base in lines_backward(read_span, size, floor):
        ev = codec.decode_line(line, offset, where) if line.startswith(_MESSAGES) else None
        # every line passed, not only those returned: a line whose type was edited away
        # from `messages_appended` would otherwise hide its messages unchecked
        if not line_checks(read_span, offset, line, data, base, floor, snap):
            return None  # the fold checks every line and says what is wrong
        if line.startswith(_TOMBSTONE):
            return _newest(found, n)
        if type(ev) is MessagesAppended and ev.messages:
            found.append(ev.messages)
            have += len(ev.messages)
            if have >= n:
                return _newest(found, n)
    if snap is not None and have < n:
        older = _checked_snapshot_tail(read_span, snap, n - have, checked_snapshots)
        if older is None:
            return None
        found.append(older)
    return _newest(found, n)


def lines_backward(
    read_span: SpanReader, size: int, floor: int, wanted: Callable[[bytes], bool] | None = None
) -> Iterator[tuple[int, bytes, bytes, int]]:
    """The committed lines of the live log from its end back to byte `floor` (the
    start, or the first byte after an opening snapshot line), newest first, read in
    chunks: (offset, line without its newline, the chunk `data` holding it, the
    chunk's offset `base`). `wanted`: a test of raw bytes true of any bytes holding a
    line the caller wants; the lines of a chunk it is false of are not yielded (one
    test of the chunk, not one per line), and it is asked of the next chunk only once
    the caller has taken this one's lines (so it may change as they come)."""
    pos = size  # lines from `pos` on are read (but for `partial`)
    partial = b""  # bytes [pos, pos + len(partial)): the end of a line begun before pos
    while pos > floor:
        start = max(floor, pos - _CHUNK)
        data = read_span(start, pos) + partial
        if start > floor:
            nl = data.find(b"\n")
            if nl < 0:  # one line longer than the chunk: read further back
                partial, pos = data, start
                continue
            partial, data = data[: nl + 1], data[nl + 1 :]
            base = start + nl + 1
        else:
            partial, base = b"", start
        if wanted is None or wanted(data):
            lines = data.split(b"\n")
            lines.pop()  # the committed region ends with a newline: nothing after it
            offset = base + len(data)
            for line in reversed(lines):
                offset -= len(line) + 1
                yield offset, line, data, base
        pos = start


def line_checks(
    read_span: SpanReader,
    offset: int,
    line: bytes,
    data: bytes = b"",
    base: int = 0,
    floor: int = 0,
    snap: SnapshotHead | None = None,
) -> bool:
    """Whether the line at byte `offset` (without its newline) chains to the link before
    it (`_link_before`: `data`, if given, holds the log's bytes from `base`, read
    already; `floor` and `snap`: the opening snapshot line's end and head, if any)."""
    link = _link_before(read_span, data, base if data else offset, offset, floor, snap)
    return link is not None and chains_to(link, line)


class ByteSearch(Protocol):
    """Which lines a backward scan (`newest_events`) decodes, told from raw bytes."""

    def in_chunk(self, data: bytes) -> bool:
        """Whether `data` (whole lines, read together) may hold a wanted line; asked of
        each chunk only once the lines of the chunk after it were visited."""

    def in_line(self, line: bytes) -> bool:
        """Whether `line`, of a chunk `in_chunk` was true of, is wanted."""


def newest_events(
    core: CoreOwner,
    session_id: str,
    tags: frozenset[str],
    visit: Callable[[Event], bool],
    search: ByteSearch | None = None,
) -> Head | None:
    """Visit the session's events of types `tags`, newest first, read from the end of
    the live log (the other lines recognised by their first bytes and never decoded),
    every line passed checked against its link as a fold checks it, until `visit`
    returns True, a tombstone (visited too if `tags` holds `session_deleted`; nothing
    older counts, as in a fold) or the log's start; returns the head of the log read.
    None when it cannot answer: the engine reads neither byte ranges nor lines by seq,
    a line does not check, or the scan reached a snapshot opening the log before
    `visit` was done (the caller folds instead, which says what is wrong). For O(what
    the caller needs) reads of a long log's end (the Agents SDK session's
    `get_items(limit)`). `search`: which lines `visit` must see, told from their raw
    bytes (`ByteSearch`); the others are neither decoded nor checked (a search for an
    id's bytes skips a long log at the speed of a byte search)."""
    core = core_of(core)
    engine = core.engine
    starts = tuple(b'{"type":"' + tag.encode() + b'",' for tag in sorted(tags))
    if isinstance(engine, SeqEngine):
        return _newest_by_seq(core, engine, session_id, starts, visit, search)
    if not isinstance(engine, RangedEngine):
        return None
    sess = core.session(session_id)
    with engine.live_view(sess.session_id) as view:
        read_span, size = view.read_span, view.head.size
        floor, snap = 0, None
        if size and read_span(0, min(size, len(SNAPSHOT_OPEN))) == SNAPSHOT_OPEN:
            snap = _snapshot_header(read_span, size)
            if snap is None or snap.length <= 0:
                return None
            floor = snap.length + 1
        chunks = None if search is None else _or_tombstone(search)
        for offset, line, data, base in lines_backward(read_span, size, floor, chunks):
            ends, visits = line.startswith(_TOMBSTONE), _wanted(line, starts, search)
            if not (ends or visits or search is None):
                continue  # (a search's skipped lines go unchecked, as its skipped chunks)
            ev = core.codec.decode_line(line, offset, view.where) if visits else None
            if not line_checks(read_span, offset, line, data, base, floor, snap):
                return None
            if ev is not None and visit(ev):
                return view.head
            if ends:
                return view.head  # nothing older counts (`_TOMBSTONE`)
        return None if snap is not None else view.head


def _wanted(line: bytes, starts: tuple[bytes, ...], search: ByteSearch | None) -> bool:
    """Whether a backward scan visits `line`: of a type asked for, and found by `search`."""
    return line.startswith(starts) and (search is None or search.in_line(line))


def _or_tombstone(search: ByteSearch) -> Callable[[bytes], bool]:
    """`search.in_chunk`, also true of a chunk holding a tombstone (where a scan ends,
    whatever it searches for)."""
    return lambda data: search.in_chunk(data) or _TOMBSTONE in data


#: lines a backward read by seq asks for first, and at most at once (doubling between)
_SEQ_BATCH = (16, 1024)


def _newest_by_seq(
    core: SessionCore,
    engine: SeqEngine,
    session_id: str,
    starts: tuple[bytes, ...],
    visit: Callable[[Event], bool],
    search: ByteSearch | None,
) -> Head | None:
    """`newest_events` on an engine that reads lines by seq (PostgreSQL, Redis): the
    head, then the lines below it in batches, each one consistent read. Every line must
    end with the `h` the line after it chains to (the head's for the newest), so
    batches read apart still make one log (a log changed between two reads gives up);
    each line visited is checked against the link before it, as a fold checks it. A
    seq the live log does not hold as a line (lines compacted or repaired away since
    the head was read) gives up, as does an encrypted line. After an opening snapshot
    (`base_seq`) the scan stops at the second line (the first chains to the snapshot's
    `base_h`, which no line's end tells) and gives up there if `visit` is not done."""
    sid = core.session(session_id).session_id
    want = _SEQ_BATCH[0]
    head, got = engine.tail(sid, want)  # (the head and the first batch: one read)
    where = engine.where(sid)
    # the head's line was read with the head: a cold store's first write after this
    # read (a pop) judges the lifecycle state from it, not from a read of its own
    core.seed_from_tail(sid, head, got, where)
    floor = 1 if head.base_seq <= 1 else head.base_seq + 2
    hi, link = head.seq, head.h  # `link`: the h line `hi` must end with
    while hi >= floor:
        lo = max(floor, hi - want + 1)
        if hi != head.seq:
            got = engine.lines_at(sid, range(hi, lo - 1, -1))
        if len(got) != hi - lo + 1:
            return None
        batch = [got[seq] for seq in range(hi, lo - 1, -1)]
        wanted = search is None or search.in_chunk(b"\n".join(g.line for g in batch))
        for got_line in batch:
            line = got_line.line
            before = link_before(got_line.before)
            if before is None or line[-18:-2] != link.encode():
                return None
            ends = line.startswith(_TOMBSTONE)  # (every line's start is read here)
            visits = wanted and _wanted(line, starts, search)
            if (ends or visits or search is None) and not chains_to(before, line):
                return None
            if visits:
                if encrypted_key_id(line) is not None:
                    return None
                if visit(core.codec.decode_line(line, got_line.offset, where)):
                    return head
            if ends:
                return head  # nothing older counts (`_TOMBSTONE`)
            link = before
        hi, want = lo - 1, min(2 * want, _SEQ_BATCH[1])
    return head if floor == 1 else None


#: A snapshot line checked whole is remembered by the digests of the `_BLOCK`-sized
#: blocks a cut read from it: a later page re-reads only those blocks and checks them.
_BLOCK = 16 * 1024


class _Unproven(Exception):
    """A block a cut needs is not one remembered as checked (or differs from it)."""


def _block_digest(data: bytes | memoryview) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


def _checked_snapshot_tail(
    read_span: SpanReader,
    snap: SnapshotHead,
    k: int,
    checked_snapshots: dict[bytes, dict[int, bytes]] | None,
) -> list[Message] | None:
    """The newest `k` messages of the opening snapshot's transcript, cut only from bytes
    that passed a check: the whole line, hashed now (the blocks the cut read are then
    remembered, by digest, under the line's `h`), or blocks remembered so, each equal to
    the block that was checked. None when the line does not check."""
    h = read_span(snap.length - 18, snap.length - 2)  # the line's `h`
    proven = checked_snapshots.get(h) if checked_snapshots is not None else None
    if proven is not None:
        assert checked_snapshots is not None

        def read_proven(start: int, end: int) -> bytes:
            first, last = start // _BLOCK, (max(end, start + 1) - 1) // _BLOCK
            data = read_span(first * _BLOCK, min(snap.length, (last + 1) * _BLOCK))
            for b in range(first, last + 1):
                block = data[(b - first) * _BLOCK : (b - first + 1) * _BLOCK]
                if proven.get(b) != _block_digest(block):
                    raise _Unproven
            return data[start - first * _BLOCK : end - first * _BLOCK]

        try:
            if _snapshot_header(read_proven, snap.length) == snap:
                return _snapshot_tail(read_proven, snap, k)
        except _Unproven:
            pass
        # changed since, or a longer cut: check the line whole (another thread's page
        # may have dropped it already: the memo is shared, unlocked)
        checked_snapshots.pop(h, None)
    # the entry's bytes are a slice of one line, whose hash covers it whole: the cut is
    # made from the very bytes hashed, and the header read before must be theirs
    line = read_span(0, snap.length)
    if not chains_to(snap.base_h, line):
        return None
    used: set[int] = set()

    def read_line(start: int, end: int) -> bytes:
        used.update(range(start // _BLOCK, (max(end, start + 1) - 1) // _BLOCK + 1))
        return line[start:end]

    if _snapshot_header(read_line, len(line)) != snap:
        return None
    older = _snapshot_tail(read_line, snap, k)
    if older is not None and checked_snapshots is not None:
        if len(checked_snapshots) >= 8:  # older snapshots: replaced by compaction
            checked_snapshots.clear()
        view = memoryview(line)
        checked_snapshots[line[-18:-2]] = {
            b: _block_digest(view[b * _BLOCK : (b + 1) * _BLOCK]) for b in used
        }
    return older


def _newest(batches: list[list[Message]], n: int) -> list[Message]:
    out: list[Message] = []
    for batch in reversed(batches):
        out.extend(batch)
    return out[len(out) - n :] if len(out) > n else out


def _snapshot_header(read_span: SpanReader, size: int) -> SnapshotHead | None:
    """The fields of the opening snapshot line before its states."""
    found = find_snapshot_head(lambda n: read_span(0, min(size, n)))
    return None if found is None else found[0]


def _link_before(
    read_span: SpanReader,
    data: bytes,
    base: int,
    offset: int,
    floor: int,
    snap: SnapshotHead | None,
) -> str | None:
    """The link the line at byte `offset` chains to: "" at the start of the log, the
    opening snapshot's `base_h` right after it, else the `h` ending the line before
    (`data` holds the log's bytes from `base`). None when the bytes before it do not
    end with an `h` (a blank line, a damaged line)."""
    if snap is not None and offset == floor:
        return snap.base_h
    i = offset - base
    if data and i >= LINE_END_LEN:  # (read with the line already)
        return link_ending(data[i - LINE_END_LEN : i])
    return link_at(read_span, offset)


def _snapshot_tail(read_span: SpanReader, snap: SnapshotHead, k: int) -> list[Message] | None:
    """The newest `k` messages of the transcript state in the snapshot opening the log."""
    span = snap.layout.get("transcript")
    if span is None:
        return None
    a, b = span
    prefix = b'{"version":1,"state":['
    if read_span(a, a + len(prefix)) != prefix or read_span(b - 2, b) != b"]}":
        return None  # another version of the transcript state: fold instead
    lo, hi = a + len(prefix), b - 2  # the state list's elements: [lo, hi)
    if lo == hi:
        return []
    step = _CHUNK
    while True:
        start = max(lo, hi - step)
        messages = _suffix_messages(read_span(start, hi), k, start == lo)
        if messages is not None:
            return messages
        if start == lo:
            return None  # not a list of messages after all: fold instead
        step *= 4


def _suffix_messages(data: bytes, k: int, whole: bool) -> list[Message] | None:
    """The newest `k` messages among the list elements ending `data`, or None if `data`
    does not reach back far enough. A boundary found inside a nested object (a
    metadata value with a `role` key) leaves a suffix that is not a list of messages:
    decoding it fails and the search moves one boundary further back."""
    pos = len(data)
    candidates = 0
    while True:
        pos = data.rfind(_BOUNDARY, 0, pos)
        candidates += 1
        if pos < 0:
            if not whole:
                return None
            try:
                messages = _message_list.decode(b"[" + data + b"]")
            except msgspec.MsgspecError:
                return None
            return messages[len(messages) - k :] if len(messages) > k else messages
        if candidates < k:
            continue  # k messages need k boundaries at least: decode once, when found
        try:
            messages = _message_list.decode(b"[" + data[pos + 1 :] + b"]")
        except msgspec.MsgspecError:
            continue  # a nested object's boundary: look further back
        if len(messages) >= k:
            return messages[len(messages) - k :]
