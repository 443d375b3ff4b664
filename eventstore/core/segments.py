"""Reading the segments of a session's history: each segment's checked lines, where its
chain opens, whether an archived one was cut short, and the `archive_pruned` records
that say where pruned history ends. Shared by the fold loop (a state rebuilt from the
archive) and the operations that read history (`eventstore.ops`)."""

from __future__ import annotations

import re

import msgspec

from eventstore.engines.base import History, Segment
from eventstore.errors import CorruptLogError, EventStoreError
from eventstore.format.chain import SNAPSHOT_OPEN
from eventstore.format.codec import EventCodec, LineDecoder
from eventstore.format.events import ArchivePruned
from eventstore.format.reader import Lines, read_lines

__all__ = [
    "archive_shortfall",
    "opening_chain",
    "pruned_start",
    "pruning_records",
    "read_segment",
]


_PRUNED_TAG = b'"type":"archive_pruned"'


_pruned_decoder = msgspec.json.Decoder(ArchivePruned)


class _CarriedRecords(msgspec.Struct):
    """The one field of a snapshot line that pruning reads: the records it carries."""

    pruned: list[msgspec.Raw] = msgspec.field(default_factory=list)


_carried_decoder = msgspec.json.Decoder(_CarriedRecords)


def pruning_records(data: bytes) -> list[tuple[ArchivePruned, bytes]]:
    """Every `archive_pruned` record in a segment's bytes, in order, with its line
    verbatim: lines of their own, and those a snapshot line carries (`Snapshot.pruned`).
    A line that does not decode is passed over here (the chain check reports it)."""
    found: list[tuple[ArchivePruned, bytes]] = []
    pos = data.find(_PRUNED_TAG)
    while pos >= 0:
        start = data.rfind(b"\n", 0, pos) + 1
        end = data.find(b"\n", pos)
        if end < 0:
            break  # a torn tail: not a committed record
        line = data[start:end]
        try:
            if line.startswith(SNAPSHOT_OPEN):
                raws = [bytes(r) for r in _carried_decoder.decode(line).pruned]
            else:
                raws = [line]
            found.extend((_pruned_decoder.decode(raw), raw) for raw in raws)
        except msgspec.MsgspecError:
            pass
        pos = data.find(_PRUNED_TAG, end)
    return found


def pruned_start(hist: History) -> tuple[int, str | None]:
    """The first sequence number pruning kept (1: nothing was pruned) and the link it
    chains to (None: unknown, the record predates `last_h`; its own hash goes unchecked).

    `prune_archive` appends an `archive_pruned` event before it removes the oldest
    archived segments, and every compaction carries the records of the log it replaces
    into its snapshot (`Snapshot.pruned`), so the live log always holds them: pruned
    history is told from a lost archive by them, the largest `last_seq` one names, plus
    one. The archived segments are searched too when their names leave a gap (a first
    segment not at seq 1, or a hole): a record archived by a compaction that predates
    `Snapshot.pruned`."""
    nxt = 1
    gap = False
    for seg in hist.segments:
        if not seg.archived or seg.first_seq is None:
            break
        if seg.first_seq > nxt:
            gap = True
            break
        nxt = max(nxt, (seg.last_seq or 0) + 1)
    kept, link = 1, None
    for seg in hist.segments:
        if seg.archived and not gap:
            continue
        try:
            data = seg.read()
        except (OSError, EventStoreError):
            continue  # (its reader reports it: verify as `unreadable`)
        for ev, _ in pruning_records(data):
            if ev.last_seq + 1 > kept:
                kept, link = ev.last_seq + 1, ev.last_h or None
    return kept, link


def read_segment(
    codec: EventCodec,
    seg: Segment,
    decoder: LineDecoder,
    *,
    keep_raw: bool = False,
    after: tuple[int, str | None] | None = None,
) -> Lines:
    """The checked lines of one segment of a history. `after`: the seq and link where
    the segment before it ended; a segment that does not open with a snapshot continues
    from there (the first opens at seq 1). An archived segment was complete when it was
    archived: a torn tail in it, or fewer events than it was archived with, means it was
    cut short since, which is corruption (CorruptLogError), never a torn tail."""
    data = seg.read()
    seq, link = opening_chain(data, after)
    lines = read_lines(data, codec, decoder, seg.where, keep_raw=keep_raw, seq=seq, link=link)
    if seg.archived:
        problem = archive_shortfall(seg, len(data), lines.end, lines.seq if lines.events else None)
        if problem is not None:
            raise CorruptLogError(seg.where, problem[0], problem[1], problem[2])
    return lines


def opening_chain(data: bytes, after: tuple[int, str | None] | None) -> tuple[int, str | None]:
    """The (seq, link) a segment's first line chains to: a segment opening with a
    snapshot chains to the snapshot's own `base_h`, whatever is passed; one without
    continues `after` (the end of the segment before it; a link of None after pruning:
    unknown), or opens the history at 1.
    An archived segment holding the events after an archived snapshot opens this way."""
    if after is None or data.startswith(SNAPSHOT_OPEN) or _opens_history(data):
        return 0, ""
    return after


_FIRST_SEQ = re.compile(rb'\{"type":"[^"]*","seq":(\d+)[,}]')


def _opens_history(data: bytes) -> bool:
    """Whether the first line is seq 1: a copy of the history from its start (an old log
    archived whole beside a copy of its prefix, by an install stopped before it named
    the archive). It chains to the start; readers skip the events they already hold."""
    m = _FIRST_SEQ.match(data)
    return m is not None and m[1] == b"1"


def archive_shortfall(
    seg: Segment, size: int, end: int, last_seq: int | None
) -> tuple[int, int | None, str] | None:
    """(offset, seq, reason) if the archived segment `seg` ends short: bytes after its
    last complete batch (`end` of `size`), or a last seq below the one it was archived
    with; None if it is whole."""
    if end < size:
        return (
            end,
            None if last_seq is None else last_seq + 1,
            f"the archived segment ends in {size - end} bytes that are not a complete"
            " batch: it was cut short (an archive is written whole, it has no torn tail)",
        )
    if seg.last_seq is not None and (last_seq or 0) < seg.last_seq:
        return (
            end,
            (last_seq or 0) + 1,
            f"the archived segment ends at seq {last_seq or 0}, but it was archived"
            f" holding up to seq {seg.last_seq}: it was cut short",
        )
    return None
