"""What the LangGraph saver stores and how it folds: its events, the entries they fold
into, and its two projections (pure, as every projection).

- `langgraph` (`LangGraphProjection`): every checkpoint, channel blob and pending write
  of a thread, as one flat dict of immutable entries, plus each namespace's newest
  checkpoint id. `list`, reads of a named checkpoint, copies and removals read it,
  each blob through `whole_blob` (or every entry through `whole_entries`).
- `langgraph_head` (`LangGraphHeadProjection`): per namespace, only the newest
  checkpoint with its channel blobs and pending writes: what `get_tuple` of "the latest"
  returns (a graph's every `invoke` starts with it). Its state stays the size of one
  checkpoint however long the thread grows. Where a fold cannot know the newest
  checkpoint's contents from what it keeps (the newest was removed; a fork's channels
  point at blobs of an older checkpoint; a version no blob was ever put for), it says
  so (`NamespaceHead.head` is None) and the saver reads the `langgraph` projection.

A `put`'s blob may be a delta against the blob of its channel in the namespace's newest
checkpoint (`BlobPut.delta`, `eventstore.integrations.langgraph_delta`). The head
projection applies it as it folds (its state and fold cache hold whole blobs). The full
index keeps such a blob LINKED to its base (a `DeltaChain` entry: the base value object,
the delta's tail, a few rewritten first bytes), so it holds each channel's bytes about
once instead of once per version, and a fold copies no whole blob; a reader gets the
value whole in one join (`whole_blob`), and `encode_state` writes every blob whole (a
snapshot is as before). Both check the delta against its base as they fold: the full
index raises `CorruptLogError` for a delta whose base it does not hold as it was, and
the head leaves its namespace unknown (the full index then answers).

The head projection keeps its fold in the store's persistent fold cache (`cache_folds`),
so a new process folds only what was appended after the cache, and the cache holds one
checkpoint per namespace. The full index is not cached: its state is as large as the
log, so a cache would be a second copy of every value on disk and would cost about as
much to decode as the log costs to fold.

Entries and events are msgspec Structs with `gc=False`: they hold only strings, bytes,
numbers and other such Structs, so they cannot form reference cycles, and a cold fold
of thousands of them no longer triggers the cyclic garbage collector (whose first full
pass in a fresh process cost more than the fold itself).

This module imports LangGraph only to fold pending writes (`merged_writes`), so the
`eventstore` command (which loads `EVENT_TYPES` through the `eventstore.event_types`
entry point) names these events where LangGraph is not installed.
"""

# no `from __future__ import annotations`: msgspec reads these structs' annotations
# as objects, not strings to evaluate; that keeps decoder builds on cold loads ~3x cheaper

from collections.abc import Callable, Iterable
from typing import cast

import msgspec

from eventstore.errors import CorruptLogError, SnapshotVersionError
from eventstore.format.events import (
    Event,
    Snapshot,
)
from eventstore.integrations.langgraph_delta import (
    STAND_IN_DATA,
    STAND_IN_TYPE,
    BlobDelta,
    DeltaChain,
    delta_of,
)
from projections import (
    StructProjection,
    restore_state,
)

__all__ = [
    "EVENT_TYPES",
    "HEAD_PROJECTION",
    "PROJECTION",
    "PROJECTIONS",
    "PRUNED",
    "PUT_TAGS",
    "STAND_IN",
    "BlobEntry",
    "BlobPut",
    "CheckpointEntry",
    "CheckpointPut",
    "CheckpointsRemoved",
    "DeltaChain",
    "Entry",
    "HeadEntry",
    "HeadState",
    "LangGraphHeadProjection",
    "LangGraphProjection",
    "NamespaceHead",
    "NewestEntry",
    "State",
    "ThreadCopied",
    "TypedValue",
    "WriteRecord",
    "WritesEntry",
    "WritesPut",
    "against_head",
    "blob_key",
    "checkpoint_key",
    "chain_whole",
    "linked_blob",
    "newest_key",
    "whole_blob",
    "whole_entries",
    "writes_key",
]


# -- what is stored --------------------------------------------------------------------


class TypedValue(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """A value as the serde encoded it: its type name and its bytes."""

    type: str
    data: bytes


class BlobPut(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """One channel's value at one version (`value` None: the channel is empty).

    With `delta`, the value is stored as its change from the blob of the same channel
    in the namespace's newest checkpoint (`eventstore.integrations.langgraph_delta`),
    and `value` is `STAND_IN`: what an older release, which ignores `delta`, reads and
    fails to decode. The head projection keeps the whole value (`full`); the full index
    keeps it linked to its base (`BlobDelta.linked`) and reads it whole (`whole_blob`)."""

    channel: str
    version: str  # the version as JSON, so 1 and "1" stay apart
    value: TypedValue | None
    delta: BlobDelta | None = None

    def full(self, base: TypedValue | None) -> TypedValue | None:
        """The whole value, `delta` applied over `base` (the blob it names); None if
        `base` is not that blob. Without `delta`: `value`."""
        if self.delta is None:
            return self.value
        if base is None:
            return None
        data = self.delta.applied(base.type, base.data)
        return None if data is None else TypedValue(self.delta.type, data)


STAND_IN = TypedValue(STAND_IN_TYPE, STAND_IN_DATA)


class WriteRecord(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """One pending write of a task."""

    task_id: str
    idx: int
    channel: str
    value: TypedValue
    task_path: str = ""


class CheckpointEntry(msgspec.Struct, frozen=True, tag="checkpoint", tag_field="kind", gc=False):
    """A checkpoint without its channel values (those are blobs, by channel version)."""

    ns: str
    checkpoint_id: str
    parent_id: str | None
    run_id: str | None
    versions: dict[str, str]  # channel -> version as JSON
    checkpoint: TypedValue
    metadata: TypedValue


class BlobEntry(msgspec.Struct, frozen=True, tag="blob", tag_field="kind", gc=False):
    """A channel value, referenced by every checkpoint holding its version."""

    value: TypedValue | None


class WritesEntry(msgspec.Struct, frozen=True, tag="writes", tag_field="kind", gc=False):
    """The pending writes of one checkpoint, in `writes_sort_key` order."""

    ns: str
    checkpoint_id: str
    writes: tuple[WriteRecord, ...]


class NewestEntry(msgspec.Struct, frozen=True, tag="newest", tag_field="kind", gc=False):
    """The newest checkpoint id of a namespace (an index: reads of "the latest" are O(1))."""

    checkpoint_id: str


Entry = CheckpointEntry | BlobEntry | WritesEntry | NewestEntry
# the full index in memory: a blob put as a delta is a `DeltaChain` (see the module
# docstring); what it encodes and decodes is `dict[str, Entry]`, every blob whole
State = dict[str, Entry | DeltaChain]


def whole_blob(entry: Entry | DeltaChain | None) -> BlobEntry | None:
    """The blob at a key of the full index, whole (None: no blob there): the one way a
    reader gets a blob's value from it."""
    if isinstance(entry, DeltaChain):
        return _materialized(entry)
    return entry if isinstance(entry, BlobEntry) else None


def whole_entries(state: State) -> dict[str, Entry]:
    """Every entry of the full index, blobs whole: what a snapshot stores and a copied
    thread's event carries."""
    return {k: _materialized(e) if isinstance(e, DeltaChain) else e for k, e in state.items()}


def _materialized(chain: DeltaChain) -> BlobEntry:
    return BlobEntry(TypedValue(chain.type, chain.whole()))


class CheckpointPut(Event, tag="langgraph_checkpoint", kw_only=True, gc=False):
    """`put`: a checkpoint and the blobs of the channels it changed."""

    ns: str
    checkpoint_id: str
    parent_id: str | None = None
    run_id: str | None = None
    versions: dict[str, str]
    checkpoint: TypedValue
    metadata: TypedValue
    blobs: list[BlobPut] = msgspec.field(default_factory=list)

    def entry(self) -> CheckpointEntry:
        """The checkpoint as the projections keep it."""
        return CheckpointEntry(
            self.ns,
            self.checkpoint_id,
            self.parent_id,
            self.run_id,
            self.versions,
            self.checkpoint,
            self.metadata,
        )


class WritesPut(Event, tag="langgraph_writes", kw_only=True, gc=False):
    """`put_writes`: a task's writes against one checkpoint."""

    ns: str
    checkpoint_id: str
    writes: list[WriteRecord]


PRUNED = "prune"  # the `reason` of a prune's removal


class CheckpointsRemoved(Event, tag="langgraph_removed", kw_only=True, gc=False):
    """`delete_for_runs` / `prune`: checkpoints removed, as [ns, checkpoint_id] pairs;
    `unparented`: the checkpoints kept that are left with no parent (a prune's, whose
    parent it removed, as PostgresSaver's prune leaves them)."""

    checkpoints: list[tuple[str, str]]
    reason: str
    # empty in a removal written before it existed, which then folds as it always did
    unparented: list[tuple[str, str]] = msgspec.field(default_factory=list)

    def is_maintenance(self) -> bool:
        """A prune's removal is upkeep, as the compaction it ends with: a thread pruned
        nightly still ages for `gc --idle` from its last put. A `delete_for_runs` changes
        what the thread holds: activity."""
        return self.reason == PRUNED


class ThreadCopied(Event, tag="langgraph_thread_copied", kw_only=True, gc=False):
    """`copy_thread`: every entry of the source thread, merged into this one."""

    source_thread_id: str
    entries: dict[str, Entry]


EVENT_TYPES: tuple[type[Event], ...] = (CheckpointPut, WritesPut, CheckpointsRemoved, ThreadCopied)
_TAGS = frozenset(
    {"langgraph_checkpoint", "langgraph_writes", "langgraph_removed", "langgraph_thread_copied"}
)
#: The tags of the lines a read of one checkpoint from the log decodes: puts and writes.
PUT_TAGS = frozenset({"langgraph_checkpoint", "langgraph_writes"})


def checkpoint_key(ns: str, checkpoint_id: str) -> str:
    """The key of a checkpoint in the `langgraph` state."""
    return f"c{len(ns)}:{ns}{checkpoint_id}"


def writes_key(ns: str, checkpoint_id: str) -> str:
    """The key of a checkpoint's pending writes in the `langgraph` state."""
    return f"w{len(ns)}:{ns}{checkpoint_id}"


def newest_key(ns: str) -> str:
    """The key of a namespace's newest checkpoint id in the `langgraph` state."""
    return f"n{len(ns)}:{ns}"


def blob_key(ns: str, channel: str, version: str) -> str:
    """The key of a channel's value at a version in the `langgraph` state."""
    return f"b{len(ns)}:{ns}{len(channel)}:{channel}{version}"


def _no_parent(entry: CheckpointEntry) -> CheckpointEntry:
    """`entry` with no parent (a prune removed it)."""
    return msgspec.structs.replace(entry, parent_id=None)


def merged_writes(old: WritesEntry | None, event: WritesPut) -> WritesEntry:
    """A checkpoint's pending writes after `event`: a regular write is kept once (a
    retried put_writes changes nothing); a special one (error, interrupt, ...) is
    replaced by the newest."""
    merged = {(w.task_id, w.idx): w for w in old.writes} if old is not None else {}
    for w in event.writes:
        if w.idx >= 0 and (w.task_id, w.idx) in merged:
            continue
        merged[(w.task_id, w.idx)] = w
    # LangGraph's order, imported here: this module loads without LangGraph, so every
    # `eventstore` command knows these events (the `eventstore.event_types` entry point)
    from langgraph.checkpoint.base import writes_sort_key

    ordered = sorted(merged.values(), key=lambda w: writes_sort_key(w.task_path, w.task_id, w.idx))
    return WritesEntry(event.ns, event.checkpoint_id, tuple(ordered))


_deterministic = msgspec.json.Encoder(order="deterministic")
_msgpack = msgspec.msgpack.Encoder()


# -- every checkpoint ------------------------------------------------------------------


class LangGraphProjection(StructProjection[State]):
    """The checkpoints, blobs and pending writes of one thread, as one flat dict.

    Entries are immutable and `apply` only sets or deletes keys, so `copy` is one dict
    copy (a single C call, never torn by a concurrent fold in another thread).
    """

    name = "langgraph"
    version = 1
    event_types = _TAGS
    state_type = dict[str, Entry]  # as encoded: every blob whole
    changes_events = False  # a writer folds the events it put, not a decode of them
    # not kept in the fold cache: its state is as large as the log itself (a second
    # copy of every value on disk), and decoding it costs about what folding the log does

    def __init__(self) -> None:
        self._decoder = msgspec.json.Decoder(dict[str, Entry])

    def initial(self) -> State:
        """No checkpoints."""
        return {}

    def apply(self, state: State, event: Event) -> State:
        """Fold one saver event into the thread's entries."""
        if isinstance(event, CheckpointPut):
            # every value whole before any is set: a delta's base may be at the version
            # another blob of the event rewrites
            for key, blob in _index_blobs(state, event):
                state[key] = blob
            state[checkpoint_key(event.ns, event.checkpoint_id)] = event.entry()
            newest = state.get(newest_key(event.ns))
            if not isinstance(newest, NewestEntry) or event.checkpoint_id > newest.checkpoint_id:
                state[newest_key(event.ns)] = NewestEntry(event.checkpoint_id)
        elif isinstance(event, WritesPut):
            key = writes_key(event.ns, event.checkpoint_id)
            old = state.get(key)
            state[key] = merged_writes(old if isinstance(old, WritesEntry) else None, event)
        elif isinstance(event, CheckpointsRemoved):
            for ns, checkpoint_id in event.checkpoints:
                state.pop(checkpoint_key(ns, checkpoint_id), None)
                state.pop(writes_key(ns, checkpoint_id), None)
            for ns, checkpoint_id in event.unparented:
                key = checkpoint_key(ns, checkpoint_id)
                kept = state.get(key)
                if isinstance(kept, CheckpointEntry):
                    state[key] = _no_parent(kept)
            _drop_unreferenced_blobs(state)
            _index_newest(state, {ns for ns, _ in event.checkpoints})
        elif isinstance(event, ThreadCopied):
            state.update(event.entries)
            _index_newest(
                state, {e.ns for e in event.entries.values() if isinstance(e, CheckpointEntry)}
            )
        return state

    def copy(self, state: State) -> State:
        """A copy sharing the immutable entries (see the class docstring)."""
        return dict(state)

    def encode_state(self, state: State) -> bytes:
        """The entries as JSON, keys sorted, every blob whole: equal states encode equal
        whatever order their entries were folded in and whether a blob is linked or
        whole (verify compares snapshots this way)."""
        return _deterministic.encode(whole_entries(state))

    def decode_state(self, data: bytes) -> State:
        """The entries back from `encode_state`'s JSON (one prebuilt decoder)."""
        # (every blob whole: a state of no links)
        return cast(State, self._decoder.decode(data))


def _index_blobs(state: State, event: CheckpointPut) -> list[tuple[str, BlobEntry | DeltaChain]]:
    """The blobs `event` brings, by key: a delta linked to the blob it names in `state`
    (`BlobDelta.linked`: no whole copy of the base). The saver made it against the head
    projection's newest checkpoint, whose blobs the index holds at the same keys (so it
    is there); a missing or different base is a log this saver did not write as it is,
    an error."""
    out: list[tuple[str, BlobEntry | DeltaChain]] = []
    for b in event.blobs:
        key = blob_key(event.ns, b.channel, b.version)
        if b.delta is None:
            out.append((key, BlobEntry(b.value)))
            continue
        value = linked_blob(b.delta, state.get(blob_key(event.ns, b.channel, b.delta.base)))
        if value is None:
            raise CorruptLogError(
                None,
                0,
                event.seq,
                f"checkpoint {event.checkpoint_id!r} (namespace {event.ns!r}): the delta"
                f" of channel {b.channel!r} is made against its blob at version"
                f" {b.delta.base}, which the thread's index does not hold as it was",
            )
        out.append((key, value))
    return out


def linked_blob(delta: BlobDelta, base: Entry | DeltaChain | None) -> BlobEntry | DeltaChain | None:
    """The value `delta` makes over `base` (the full index's entry at the version it
    names) as the full index keeps it: linked to the base (`BlobDelta.linked`), or a
    whole blob where a link would not be cheaper; None when `base` is not a blob this
    delta fits."""
    value: bytes | DeltaChain | None = None
    if isinstance(base, DeltaChain):
        value = delta.linked(base.type, base)
    elif isinstance(base, BlobEntry) and base.value is not None:
        value = delta.linked(base.value.type, base.value.data)
    if isinstance(value, bytes):  # kept whole
        return BlobEntry(TypedValue(delta.type, value))
    return value


def chain_whole(chain: list[BlobPut]) -> BlobEntry | None:
    """A blob put read from the log, whole: `chain` is the put, then the put its delta
    was made against (the newest of its base version before its line), and so on back
    to a whole one; linked as the full index links them (`linked_blob`), joined once.
    None when a link does not fit (the fold says what is wrong)."""
    value: BlobEntry | DeltaChain | None = BlobEntry(chain[-1].value)
    for link in reversed(chain[:-1]):
        assert link.delta is not None
        value = linked_blob(link.delta, value)
    return whole_blob(value)


def _index_newest(state: State, namespaces: set[str]) -> None:
    newest: dict[str, str] = {}
    for e in state.values():
        if isinstance(e, CheckpointEntry) and e.ns in namespaces:
            newest[e.ns] = max(e.checkpoint_id, newest.get(e.ns, ""))
    for ns in namespaces:
        if ns in newest:
            state[newest_key(ns)] = NewestEntry(newest[ns])
        else:
            state.pop(newest_key(ns), None)


def _drop_unreferenced_blobs(state: State) -> None:
    referenced = {
        blob_key(e.ns, channel, version)
        for e in state.values()
        if isinstance(e, CheckpointEntry)
        for channel, version in e.versions.items()
    }
    # a linked blob's base stays alive through the link when its key goes
    blobs = (BlobEntry, DeltaChain)
    for key in [k for k, e in state.items() if isinstance(e, blobs) and k not in referenced]:
        del state[key]


# -- each namespace's newest checkpoint ------------------------------------------------


class HeadEntry(msgspec.Struct, frozen=True, gc=False):
    """A namespace's newest checkpoint with everything `get_tuple` returns of it: the
    blob of each channel at the version the checkpoint names, and its pending writes."""

    checkpoint: CheckpointEntry
    blobs: dict[str, BlobEntry]  # channel -> its blob at checkpoint.versions[channel]
    writes: WritesEntry | None = None


class NamespaceHead(msgspec.Struct, frozen=True, gc=False):
    """What the head projection knows of one namespace.

    `max_id`: the largest checkpoint id ever put or copied into it (None: none yet), so
    a checkpoint with a larger id is the newest whatever was removed. `head`: the newest
    checkpoint (whose id is then `max_id`), or None when this fold cannot know it (the
    reader must then read the `langgraph` projection). `early`: pending writes against
    ids larger than `max_id` (a checkpoint not put yet, which would be the newest).
    """

    max_id: str | None
    head: HeadEntry | None
    early: dict[str, WritesEntry] = {}


HeadState = dict[str, NamespaceHead]

# (channel, version) -> the blob an event brings for it
_Blobs = Callable[[str, str], BlobEntry | None]


def _resolve(entry: CheckpointEntry, brought: _Blobs, prev: HeadEntry | None) -> HeadEntry | None:
    """`entry` as a head with its blobs: each from what the event brought, else from
    the previous head at the same version; None if any channel's blob is unknown here."""
    blobs: dict[str, BlobEntry] = {}
    for channel, version in entry.versions.items():
        blob = brought(channel, version)
        if blob is None and prev is not None and prev.checkpoint.versions.get(channel) == version:
            blob = prev.blobs.get(channel)
        if blob is None:
            return None
        blobs[channel] = blob
    return HeadEntry(entry, blobs)


def _with_blobs(head: HeadEntry, brought: _Blobs) -> HeadEntry:
    """`head` with the blobs an event rewrote at the versions it names."""
    blobs = head.blobs
    for channel, version in head.checkpoint.versions.items():
        blob = brought(channel, version)
        if blob is not None:
            blobs = dict(blobs) if blobs is head.blobs else blobs
            blobs[channel] = blob
    return head if blobs is head.blobs else HeadEntry(head.checkpoint, blobs, head.writes)


def _with_writes(head: HeadEntry, writes: WritesEntry | None) -> HeadEntry:
    return HeadEntry(head.checkpoint, head.blobs, writes)


def _copied_blobs(entries: dict[str, Entry], ns: str) -> _Blobs:
    """The blobs of namespace `ns` among copied entries, by (channel, version)."""

    def brought(channel: str, version: str) -> BlobEntry | None:
        blob = entries.get(blob_key(ns, channel, version))
        return blob if isinstance(blob, BlobEntry) else None

    return brought


def _later(early: dict[str, WritesEntry], than: str) -> dict[str, WritesEntry]:
    return {k: w for k, w in early.items() if k > than}


class LangGraphHeadProjection(StructProjection[HeadState]):
    """Each namespace's newest checkpoint with its blobs and writes (see the module
    docstring): the state `get_tuple` of the latest checkpoint reads.

    For every event sequence, a namespace whose `head` is not None holds exactly what
    the `langgraph` projection would return as its newest checkpoint (tested against
    it and against LangGraph's InMemorySaver). Entries are immutable; `copy` is one
    dict copy.
    """

    name = "langgraph_head"
    # 2: a removal's `unparented` leaves those checkpoints with no parent. A release
    # that kept the parent folded another state from the same lines, so neither may use
    # the other's fold cache; a snapshot of version 1 is derived from the full index
    # (`state_from_snapshot`), whose state is what it was
    version = 2
    event_types = _TAGS
    state_type = HeadState
    changes_events = False  # a writer folds the events it put, not a decode of them
    cache_folds = True
    # each put's delta rebuilds a whole channel blob as it is folded: a killed writer's
    # next reader should fold a few of them past the cache, not a log's worth
    cache_every = 16

    def __init__(self) -> None:
        self._decoder = msgspec.json.Decoder(HeadState)
        self._cache_decoder = msgspec.msgpack.Decoder(HeadState)

    def initial(self) -> HeadState:
        """No namespace."""
        return {}

    def apply(self, state: HeadState, event: Event) -> HeadState:
        """Fold one saver event into the heads of the namespaces it touches."""
        if isinstance(event, CheckpointPut):
            self._put_event(state, event)
        elif isinstance(event, WritesPut):
            self._writes(state, event)
        elif isinstance(event, CheckpointsRemoved):
            self._removed(state, event.checkpoints, event.unparented)
        elif isinstance(event, ThreadCopied):
            self._copied(state, event.entries)
        return state

    def _put_event(self, state: HeadState, event: CheckpointPut) -> None:
        """`put`: its blobs whole (a delta applied over the head's blob it names), then
        the checkpoint arrives. A delta whose base this head does not hold (a head this
        fold could not know, which the writer's did) leaves the head unknown: the full
        index then answers."""
        cur = state.get(event.ns)
        head = cur.head if cur is not None else None
        brought: dict[tuple[str, str], BlobEntry] = {}
        whole = True
        for b in event.blobs:
            blob = None
            if b.delta is not None and head is not None:
                at = head.checkpoint.versions.get(b.channel)
                blob = head.blobs.get(b.channel) if at == b.delta.base else None
            value = b.full(blob.value if blob is not None else None)
            if value is None and b.delta is not None:
                whole = False
                continue
            brought[(b.channel, b.version)] = BlobEntry(value)
        self._put(state, event.ns, event.entry(), lambda c, v: brought.get((c, v)), None)
        if not whole:
            now = state[event.ns]
            state[event.ns] = NamespaceHead(now.max_id, None, now.early)

    @staticmethod
    def _put(
        state: HeadState,
        ns: str,
        entry: CheckpointEntry,
        brought: _Blobs,
        writes: WritesEntry | None,
    ) -> None:
        """A checkpoint arrives in `ns` (put, or copied with `writes`), with `brought`
        blobs, which also rewrite the current head's blobs at the same versions."""
        cur = state.get(ns)
        head = cur.head if cur is not None else None
        if head is not None:
            head = _with_blobs(head, brought)
        cid = entry.checkpoint_id
        if cur is None or cur.max_id is None or cid > cur.max_id:
            # the newest now, whatever was removed before; its writes may have come first
            early = cur.early if cur is not None else {}
            new = _resolve(entry, brought, head)
            if new is not None:
                new = _with_writes(new, writes if writes is not None else early.get(cid))
            state[ns] = NamespaceHead(cid, new, _later(early, cid))
        elif head is not None and cid == head.checkpoint.checkpoint_id:
            # the head put again: its entry replaced, its writes kept
            new = _resolve(entry, brought, head)
            if new is not None:
                new = _with_writes(new, writes if writes is not None else head.writes)
            state[ns] = NamespaceHead(cur.max_id, new, cur.early)
        else:
            # an older checkpoint: not the newest unless the head is removed (and then
            # the head is unknown anyway)
            state[ns] = NamespaceHead(cur.max_id, head, cur.early)

    @staticmethod
    def _writes(state: HeadState, event: WritesPut) -> None:
        cur = state.get(event.ns)
        cid = event.checkpoint_id
        if cur is None or cur.max_id is None or cid > cur.max_id:
            early = dict(cur.early) if cur is not None else {}
            early[cid] = merged_writes(early.get(cid), event)
            state[event.ns] = NamespaceHead(
                cur.max_id if cur is not None else None,
                cur.head if cur is not None else None,
                early,
            )
        elif cur.head is not None and cid == cur.head.checkpoint.checkpoint_id:
            head = _with_writes(cur.head, merged_writes(cur.head.writes, event))
            state[event.ns] = NamespaceHead(cur.max_id, head, cur.early)

    @staticmethod
    def _removed(
        state: HeadState,
        pairs: Iterable[tuple[str, str]],
        orphans: Iterable[tuple[str, str]] = (),
    ) -> None:
        gone: dict[str, set[str]] = {}
        for ns, cid in pairs:
            gone.setdefault(ns, set()).add(cid)
        for ns, cid in orphans:
            cur = state.get(ns)
            head = cur.head if cur is not None else None
            if cur is not None and head is not None and head.checkpoint.checkpoint_id == cid:
                kept = msgspec.structs.replace(head, checkpoint=_no_parent(head.checkpoint))
                state[ns] = NamespaceHead(cur.max_id, kept, cur.early)
        for ns, ids in gone.items():
            cur = state.get(ns)
            if cur is None:
                continue
            head = cur.head
            if head is not None and head.checkpoint.checkpoint_id in ids:
                head = None  # the newest went: which one is newest now is not known here
            early = {k: w for k, w in cur.early.items() if k not in ids}
            state[ns] = NamespaceHead(cur.max_id, head, early)

    def _copied(self, state: HeadState, entries: dict[str, Entry]) -> None:
        """Entries of another thread merged into this one (`ThreadCopied`): the full
        index takes every entry (replacing those with the same keys) and its newest
        checkpoint per namespace is then the newest of both."""
        newest: dict[str, CheckpointEntry] = {}
        for e in entries.values():
            if isinstance(e, CheckpointEntry) and (
                e.ns not in newest or e.checkpoint_id > newest[e.ns].checkpoint_id
            ):
                newest[e.ns] = e
        for ns in sorted(set(state) | set(newest)):
            brought = _copied_blobs(entries, ns)
            cur = state.get(ns)
            entry = newest.get(ns)
            if entry is not None and (
                cur is None or cur.max_id is None or entry.checkpoint_id > cur.max_id
            ):
                w = entries.get(writes_key(ns, entry.checkpoint_id))
                self._put(state, ns, entry, brought, w if isinstance(w, WritesEntry) else None)
                continue
            if cur is None or cur.head is None:
                continue  # nothing known to keep up to date
            # the head stays the newest, though the copy may replace its entry or blobs
            head: HeadEntry | None = cur.head
            replaced = entries.get(checkpoint_key(ns, cur.head.checkpoint.checkpoint_id))
            if isinstance(replaced, CheckpointEntry):
                head = _resolve(replaced, brought, cur.head)
                if head is not None:
                    head = _with_writes(head, cur.head.writes)
            else:
                head = _with_blobs(cur.head, brought)
            state[ns] = NamespaceHead(cur.max_id, head, cur.early)
        # pending writes replaced by the copy's: the head's, or against a later id
        for e in entries.values():
            if not isinstance(e, WritesEntry):
                continue
            cur = state.get(e.ns)
            if cur is None or cur.max_id is None or e.checkpoint_id > cur.max_id:
                early = dict(cur.early) if cur is not None else {}
                early[e.checkpoint_id] = e
                state[e.ns] = NamespaceHead(
                    cur.max_id if cur is not None else None,
                    cur.head if cur is not None else None,
                    early,
                )
            elif cur.head is not None and e.checkpoint_id == cur.head.checkpoint.checkpoint_id:
                state[e.ns] = NamespaceHead(cur.max_id, _with_writes(cur.head, e), cur.early)

    def state_from_snapshot(self, snapshot: Snapshot) -> HeadState | None:
        """The heads of a snapshot taken before this projection existed, derived from
        the full index it holds: each namespace's newest checkpoint with its blobs and
        writes, as if the thread were copied into an empty one (None: no index)."""
        try:
            index = restore_state(PROJECTION, snapshot)
        except SnapshotVersionError:
            return None
        state: HeadState = {}
        self._copied(state, whole_entries(index))
        return state

    def copy(self, state: HeadState) -> HeadState:
        """A copy sharing the immutable entries."""
        return dict(state)

    def encode_state(self, state: HeadState) -> bytes:
        """The heads as JSON, keys sorted (equal states encode equal)."""
        return _deterministic.encode(state)

    def decode_state(self, data: bytes) -> HeadState:
        """The heads back from `encode_state`'s JSON (one prebuilt decoder)."""
        return self._decoder.decode(data)

    def encode_cache(self, state: HeadState) -> bytes:
        """The heads in the fold cache: MessagePack, whose blobs are their bytes (JSON's
        base64 made a 1,000-step thread's cache a third larger and its decoding 40x
        slower)."""
        return _msgpack.encode(state)

    def decode_cache(self, data: bytes) -> HeadState:
        """The heads back from `encode_cache`'s bytes, or from the JSON of a cache an
        earlier version wrote (a MessagePack map never starts with `{`)."""
        if data[:1] == b"{":
            return self._decoder.decode(data)
        return self._cache_decoder.decode(data)


def against_head(blobs: list[BlobPut], known: NamespaceHead | None) -> list[BlobPut]:
    """`blobs` (whole values), each stored as a delta against the blob of its channel
    in `known`'s newest checkpoint where that saves most of its bytes; as they are when
    that checkpoint is unknown (None)."""
    head = known.head if known is not None else None
    if head is None:
        return blobs
    out = []
    for b in blobs:
        version = head.checkpoint.versions.get(b.channel)
        base = head.blobs.get(b.channel)
        delta = None
        whole = base.value if base is not None else None
        if b.value is not None and version is not None and whole is not None:
            delta = delta_of(b.value.type, b.value.data, b.version, version, whole.type, whole.data)
        out.append(b if delta is None else BlobPut(b.channel, b.version, STAND_IN, delta))
    return out


PROJECTION = LangGraphProjection()
HEAD_PROJECTION = LangGraphHeadProjection()
PROJECTIONS: tuple[LangGraphProjection | LangGraphHeadProjection, ...] = (
    PROJECTION,
    HEAD_PROJECTION,
)
