"""A named older checkpoint of a LangGraph thread read from its log, not from the full
index: the lines that hold it are found by their bytes, and only those are decoded and
checked against their links (`eventstore.ops.paging.newest_events`).

What the full index (`LangGraphProjection`) answers for checkpoint C of namespace `ns`
is: C's newest put; for each channel, the newest blob put at the version C names (a
delta applied over the newest blob put at its base version before the delta's line,
and so on back to a whole one); and C's pending writes, merged over every writes line
for C in log order. Two backward scans find the same lines:

1. from the log's end to C's newest put (lines holding `"checkpoint_id":"<C>"`), or
   to its start (no put of C: the thread has no C unless a line of the kinds below
   brought one, which one more search of the log for them tells);
2. again from the end to the start, looking for C's id (its puts and writes) and the
   blob puts of the versions still needed (C's, then each delta's base): a blob of C's
   versions put after C's line, or a second put of C, gives up.

Either scan gives up (`older_checkpoint` returns None, and the caller folds the full
index, which also says what is wrong) on anything it cannot answer as the fold does: a
line that does not check, a delta whose base does not fit, an opening snapshot (a
compacted thread), any line that changes entries other than by a put (a removal, a
copied thread, a tombstone), and an encrypted session (its payloads' bytes cannot be
searched). The search is for the bytes this library writes an id or a version as
(msgspec's JSON).
"""

from __future__ import annotations

import re
from typing import NamedTuple

import msgspec

from eventstore.core.session_core import core_of
from eventstore.errors import EncryptedSessionError
from eventstore.format.events import Event
from eventstore.integrations.langgraph_state import (
    PUT_TAGS,
    BlobEntry,
    BlobPut,
    CheckpointPut,
    HeadEntry,
    WritesEntry,
    WritesPut,
    chain_whole,
    merged_writes,
)
from eventstore.ops.paging import newest_events
from eventstore.store import SessionStore

__all__ = ["OlderCheckpoint", "older_checkpoint"]

# lines that change entries other than by a put (one pattern: its literal start lets
# `re` skip from line to line, twice as fast as a byte search for each)
_REWRITES = re.compile(
    rb'\{"type":"(?:langgraph_removed|langgraph_thread_copied|session_deleted)",'
)
_json = msgspec.json.Encoder()


class OlderCheckpoint(NamedTuple):
    """The answer of a read from the log: the checkpoint with its channels' blobs
    (whole) and its pending writes, as the head projection holds its newest; None:
    the thread has no such checkpoint."""

    found: HeadEntry | None


class _Scan:
    """A backward scan's `ByteSearch`: the lines holding one of `needles` (the bytes of
    an id or a blob put); `gave_up` once a chunk holds one of `give_up`."""

    def __init__(self, needles: list[bytes], give_up: re.Pattern[bytes] | None = None) -> None:
        # (a dict: in order, and a found blob's needle goes)
        self.needles = dict.fromkeys(needles)
        self.give_up = give_up
        self.gave_up = False

    def in_chunk(self, data: bytes) -> bool:
        if self.give_up is not None and self.give_up.search(data) is not None:
            self.gave_up = True
            return True
        return self.in_line(data)

    def in_line(self, line: bytes) -> bool:
        return any(n in line for n in self.needles)


def older_checkpoint(
    store: SessionStore, session_id: str, ns: str, checkpoint_id: str
) -> OlderCheckpoint | None:
    """Checkpoint `checkpoint_id` of namespace `ns` as the full index holds it, read from
    the session's log (see the module docstring); None when this read cannot answer
    (the caller folds the full index instead)."""
    try:  # an encrypted payload's bytes cannot be searched
        core_of(store).refuse_encrypted(session_id, "")
    except EncryptedSessionError:
        return None
    found = _newest_put(store, session_id, ns, checkpoint_id)
    if found is None:
        return None
    if not found:  # no put of it: none unless a line put it otherwise (a copy)
        scan = _Scan([], _REWRITES)
        head = newest_events(store, session_id, PUT_TAGS, lambda ev: True, scan)
        return None if head is None or scan.gave_up else OlderCheckpoint(None)
    return _resolved(store, session_id, found[0])


def _newest_put(
    store: SessionStore, session_id: str, ns: str, checkpoint_id: str
) -> list[CheckpointPut] | None:
    """Scan 1: the newest put of the checkpoint (an empty list: the log has none;
    None: give up). What would change it later (a copy, a removal) scan 2 finds."""
    scan = _Scan([_id_needle(checkpoint_id)])
    found: list[CheckpointPut] = []

    def visit(ev: Event) -> bool:
        if scan.gave_up:
            return True
        if type(ev) is CheckpointPut and ev.ns == ns and ev.checkpoint_id == checkpoint_id:
            found.append(ev)
            return True
        return False

    head = newest_events(store, session_id, PUT_TAGS, visit, scan)
    return None if head is None or scan.gave_up else found


def _resolved(store: SessionStore, session_id: str, put: CheckpointPut) -> OlderCheckpoint | None:
    """Scan 2: the put's blobs, delta chains and writes (None: give up)."""
    ns, cid = put.ns, put.checkpoint_id
    scan = _Scan([_id_needle(cid)], _REWRITES)
    # (channel, version) -> the seq below which its put is wanted (the newest there)
    wanted: dict[tuple[str, str], int] = {(ch, v): put.seq + 1 for ch, v in put.versions.items()}
    scan.needles.update((_blob_needle(ch, v), None) for ch, v in wanted)
    blobs: dict[tuple[str, str], BlobPut] = {}
    writes: list[WritesPut] = []  # newest first

    def visit(ev: Event) -> bool:
        if scan.gave_up:
            return True
        if type(ev) is WritesPut:
            if ev.ns == ns and ev.checkpoint_id == cid:
                writes.append(ev)
            return False
        if type(ev) is not CheckpointPut or ev.ns != ns:
            return False
        if ev.seq > put.seq:  # after the put this read is of: it must not change it
            if ev.checkpoint_id == cid or any((b.channel, b.version) in wanted for b in ev.blobs):
                scan.gave_up = True
                return True
            return False
        bases = []
        for b in ev.blobs:
            key = (b.channel, b.version)
            if key in wanted and ev.seq < wanted[key]:
                del wanted[key]
                scan.needles.pop(_blob_needle(*key), None)
                blobs[key] = b
                if b.delta is not None:  # its base: the newest put before this line
                    bases.append((b.channel, b.delta.base))
        for key in bases:
            wanted[key] = ev.seq
            scan.needles[_blob_needle(*key)] = None
        return False

    head = newest_events(store, session_id, PUT_TAGS, visit, scan)
    if head is None or scan.gave_up:
        return None
    values: dict[str, BlobEntry] = {}
    for channel, version in put.versions.items():
        if (channel, version) not in blobs:
            continue  # never put: the full index has no value for it either
        value = _whole(blobs, channel, version)
        if value is None:
            return None
        values[channel] = value
    merged: WritesEntry | None = None
    for w in reversed(writes):
        merged = merged_writes(merged, w)
    return OlderCheckpoint(HeadEntry(put.entry(), values, merged))


def _id_needle(checkpoint_id: str) -> bytes:
    """The bytes a put or a writes line of the checkpoint holds."""
    return b'"checkpoint_id":' + _json.encode(checkpoint_id)


def _blob_needle(channel: str, version: str) -> bytes:
    """The bytes a blob put of `channel` at `version` starts with in a line (a `BlobPut`
    is an array: channel, version, ...)."""
    return b"[" + _json.encode(channel) + b"," + _json.encode(version)


def _whole(blobs: dict[tuple[str, str], BlobPut], channel: str, version: str) -> BlobEntry | None:
    """The channel's blob at `version`, whole (`chain_whole`); None when a base is
    missing or does not fit (the fold says what is wrong)."""
    chain: list[BlobPut] = []
    b: BlobPut | None = blobs[(channel, version)]
    while b is not None and b.delta is not None:
        chain.append(b)
        b = blobs.get((channel, b.delta.base))
    return None if b is None else chain_whole([*chain, b])
