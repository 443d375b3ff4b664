"""Where a LangGraph thread's lines are: an index of seqs (`LineIndexProjection`), and
a named checkpoint read through it (`indexed_checkpoint`), a few lines of the log read
by their seq (`eventstore.ops.seek`) instead of a search of the whole log.

The index maps each key of the full index (`langgraph_state.checkpoint_key`, `blob_key`,
`writes_key`) to the seqs of the lines that set it, in log order: what the full index
would hold at a key is computed from those lines alone. It is small (numbers, not
values), kept in the fold cache and current in a writer (every 16 puts, as the head),
so a fresh process reads it and the few lines a checkpoint needs. It is complete only
for a log folded from its first line with nothing but puts and writes in it: a
removal, a copied thread or a tombstone (lines that change entries otherwise) and a
snapshot opening the log (a compacted thread: snapshots never store the index) leave
it incomplete, and the reader gives up (the caller reads another way, which says what
is wrong, if anything is).
"""

# no `from __future__ import annotations`: msgspec reads these structs' annotations
# as objects, not strings to evaluate

import hashlib

import msgspec

from eventstore.core.session_core import core_of
from eventstore.errors import CorruptLogError
from eventstore.format.events import Event
from eventstore.integrations.langgraph_older import OlderCheckpoint
from eventstore.integrations.langgraph_state import (
    HEAD_PROJECTION,
    PUT_TAGS,
    BlobEntry,
    BlobPut,
    CheckpointPut,
    CheckpointsRemoved,
    HeadEntry,
    ThreadCopied,
    WritesEntry,
    WritesPut,
    blob_key,
    chain_whole,
    checkpoint_key,
    merged_writes,
    writes_key,
)
from eventstore.ops.seek import EventAt, can_seek, events_by_seq
from eventstore.store import SessionStore
from projections import StructProjection

__all__ = [
    "LINES_PROJECTION",
    "LineIndex",
    "LineIndexProjection",
    "indexed_checkpoint",
    "line_key",
    "seqs_of",
]


class LineIndex(msgspec.Struct, gc=False):
    """The seqs of the lines that set each key of the full index, in log order (one
    seq alone, as most keys have), by the key's 64-bit digest (`line_key`); `complete`:
    folded from the log's first line with no line the index cannot follow."""

    complete: bool = False
    lines: dict[int, int | list[int]] = {}


def line_key(key: str) -> int:
    """A key of the full index as the index of lines keeps it: its BLAKE2b-64 digest
    (a tenth of the cache's bytes, and ints decode faster than strings). Two keys with
    one digest share a list of seqs; a read then finds a line of another key where it
    looks, and gives up (every line read is checked to be the one it wants)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")


def seqs_of(index: LineIndex, key: str) -> list[int]:
    """The seqs of the lines that set `key` (a full index key), oldest first."""
    found = index.lines.get(line_key(key))
    return [] if found is None else [found] if isinstance(found, int) else found


def _note(lines: dict[int, int | list[int]], key: str, seq: int) -> None:
    k = line_key(key)
    old = lines.get(k)
    if old is None:
        lines[k] = seq
    elif isinstance(old, int):
        lines[k] = [old, seq]
    else:
        old.append(seq)


class LineIndexProjection(StructProjection[LineIndex]):
    """The index of lines (see the module docstring)."""

    name = "langgraph_lines"
    version = 1
    event_types = HEAD_PROJECTION.event_types  # the saver's events, as the others read
    state_type = LineIndex
    changes_events = False  # a writer folds the events it put, not a decode of them
    cache_folds = True
    cache_every = 16  # current with the head's cache, so a killed writer leaves a short fold
    in_snapshots = False  # seqs of lines a compaction archives: a compacted thread has none

    def __init__(self) -> None:
        self._cache_decoder = msgspec.msgpack.Decoder(LineIndex)

    def initial(self) -> LineIndex:
        """Incomplete until the log's first line is folded."""
        return LineIndex()

    def apply(self, state: LineIndex, event: Event) -> LineIndex:
        """Note the seq of a put or a writes line under the keys it sets; any other line
        of the saver's leaves the index incomplete (a tombstone resets it first)."""
        if not state.complete:
            if event.seq != 1:
                return state
            state.complete = True
        lines, seq = state.lines, event.seq
        if isinstance(event, CheckpointPut):
            _note(lines, checkpoint_key(event.ns, event.checkpoint_id), seq)
            for b in event.blobs:
                _note(lines, blob_key(event.ns, b.channel, b.version), seq)
        elif isinstance(event, WritesPut):
            _note(lines, writes_key(event.ns, event.checkpoint_id), seq)
        elif isinstance(event, (CheckpointsRemoved, ThreadCopied)):
            return LineIndex()  # lines that change entries otherwise: not followed
        return state

    def copy(self, state: LineIndex) -> LineIndex:
        """A copy with lists of its own."""
        return LineIndex(
            state.complete,
            {k: v if isinstance(v, int) else list(v) for k, v in state.lines.items()},
        )

    def encode_cache(self, state: LineIndex) -> bytes:
        """The index in the fold cache: MessagePack (numbers: a third of JSON's time)."""
        return msgspec.msgpack.encode(state)

    def decode_cache(self, data: bytes) -> LineIndex:
        """The index back from `encode_cache`'s bytes."""
        return self._cache_decoder.decode(data)


LINES_PROJECTION = LineIndexProjection()


def indexed_checkpoint(
    store: SessionStore, session_id: str, ns: str, checkpoint_id: str
) -> OlderCheckpoint | None:
    """Checkpoint `checkpoint_id` of namespace `ns` as the full index holds it, read
    from the lines the index names; None when this read cannot answer (the store keeps
    no index of the session, it is incomplete, a line is not where it says or does not
    check): the caller reads another way."""
    core = core_of(store)
    if not can_seek(core):
        return None

    def read(index: LineIndex) -> OlderCheckpoint | None:
        # under the session's lock: the index and the log's lines agree (no append
        # lands between them), and the index is not changed while it is read
        if not index.complete:
            return None
        puts = seqs_of(index, checkpoint_key(ns, checkpoint_id))
        if not puts:
            return OlderCheckpoint(None)
        with events_by_seq(store, session_id, PUT_TAGS) as event_at:
            if event_at is None:
                return None
            event_at.want((puts[-1], *seqs_of(index, writes_key(ns, checkpoint_id))))
            return _read(index, event_at, ns, checkpoint_id, puts[-1])

    try:
        return core.loaded_if_kept(session_id, LINES_PROJECTION, read)
    except CorruptLogError:
        return None  # a line after the index's cache does not check: another read says


def _read(
    index: LineIndex, event_at: EventAt, ns: str, checkpoint_id: str, seq: int
) -> OlderCheckpoint | None:
    """The checkpoint put at `seq`, its blobs and its writes, from their lines."""
    put = event_at(seq)
    if not isinstance(put, CheckpointPut) or (put.ns, put.checkpoint_id) != (ns, checkpoint_id):
        return None
    blobs = {}
    for channel, version in put.versions.items():
        seqs = seqs_of(index, blob_key(ns, channel, version))
        if seqs:  # (else never put: the full index has no value for it either)
            blobs[channel] = seqs[-1]
    event_at.want(blobs.values())
    values: dict[str, BlobEntry] = {}
    for channel, seq in blobs.items():
        value = _blob(index, event_at, ns, channel, put.versions[channel], seq)
        if value is None:
            return None
        values[channel] = value
    merged: WritesEntry | None = None
    for s in seqs_of(index, writes_key(ns, checkpoint_id)):
        w = event_at(s)
        if not isinstance(w, WritesPut) or (w.ns, w.checkpoint_id) != (ns, checkpoint_id):
            return None
        merged = merged_writes(merged, w)
    return OlderCheckpoint(HeadEntry(put.entry(), values, merged))


def _blob(
    index: LineIndex, event_at: EventAt, ns: str, channel: str, version: str, seq: int
) -> BlobEntry | None:
    """The channel's blob at `version` put at `seq`, whole: its delta chain, each base
    the newest put of its version before the line of the delta (as the full index
    links them), back to a whole one."""
    chain: list[BlobPut] = []
    while True:
        ev = event_at(seq)
        if not isinstance(ev, CheckpointPut) or ev.ns != ns:
            return None
        b = next((b for b in ev.blobs if (b.channel, b.version) == (channel, version)), None)
        if b is None:
            return None
        chain.append(b)
        if b.delta is None:
            return chain_whole(chain)
        version = b.delta.base
        before = [s for s in seqs_of(index, blob_key(ns, channel, version)) if s < seq]
        if not before:
            return None
        seq = before[-1]
