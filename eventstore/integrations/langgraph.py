"""`EventStoreSaver`: a LangGraph checkpointer kept in eventstore session logs.

One eventstore session per LangGraph thread (`<thread_prefix><thread_id>`, by default
`langgraph-<thread_id>`). Every saver call is one atomic append of custom events:

| saver call | events appended (one batch per thread) |
|---|---|
| `put` | `langgraph_checkpoint`: the checkpoint, its metadata and its new channel blobs |
| `put_writes` | `langgraph_writes`: a task's pending writes |
| `copy_thread` | `langgraph_thread_copied` on the target: every entry of the source |
| `delete_for_runs`, `prune` | `langgraph_removed`: the checkpoints (and writes) removed |
| `delete_thread` | the session is deleted (`SessionStore.delete_session`), leaving a tombstone |

A prune's `langgraph_removed` also names the kept checkpoints it leaves with no parent.
Two projections fold those events (`eventstore.integrations.langgraph_state`): `langgraph`,
every checkpoint, blob and pending write of a thread as one flat dict of immutable
entries; and `langgraph_head`, each namespace's newest checkpoint with its blobs and
writes. `get_tuple` of the latest checkpoint (what every graph `invoke` starts with)
reads the small head projection and falls back to the full one when the head cannot
know the answer (after a removal, a fork onto an older branch, a copy); `list`, copies
and removals read the full one; a named older checkpoint is read from the lines of the
log that hold it when the full index is not folded (`langgraph_older`). The head is
kept in the store's persistent fold cache, so a new process folds only what was
appended after the cache. Values are encoded by the saver's `serde` (LangGraph's
`JsonPlusSerializer` by default) and stored as (type, base64 bytes) pairs; a read
decodes only what it returns.

A changed channel's blob is stored as a delta against the same channel's blob in the
thread's newest checkpoint when that saves most of its bytes (`langgraph_delta`), judged
against the head state at the exact head the append commits at. The head projection
applies it as it folds; the full index keeps it linked to its base and reads it whole
(`whole_blob`), so it holds a long thread's message list about once, not once a step.

Channel versions are strings with a random suffix (as LangGraph's in-memory saver makes
them), so two branches forked from one checkpoint never write the same blob key.
"""

from __future__ import annotations

import os
import random
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any, cast

import msgspec

try:
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import (
        WRITES_IDX_MAP,
        BaseCheckpointSaver,
        ChannelVersions,
        Checkpoint,
        CheckpointMetadata,
        CheckpointTuple,
        get_checkpoint_id,
        get_checkpoint_metadata,
    )
    from langgraph.checkpoint.serde.base import SerializerProtocol
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "eventstore.integrations.langgraph needs LangGraph:"
        " pip install 'harness-eventstore[langgraph]'"
    ) from exc

from eventstore.aio import AsyncSessionStore
from eventstore.core.session_core import core_of
from eventstore.errors import InvalidArgumentError, SnapshotVersionError
from eventstore.integrations.langgraph_lines import LINES_PROJECTION, indexed_checkpoint
from eventstore.integrations.langgraph_older import OlderCheckpoint, older_checkpoint
from eventstore.integrations.langgraph_state import (
    EVENT_TYPES,
    HEAD_PROJECTION,
    PROJECTION,
    PRUNED,
    BlobEntry,
    BlobPut,
    CheckpointEntry,
    CheckpointPut,
    CheckpointsRemoved,
    HeadEntry,
    HeadState,
    LangGraphHeadProjection,
    LangGraphProjection,
    NewestEntry,
    State,
    ThreadCopied,
    TypedValue,
    WriteRecord,
    WritesEntry,
    WritesPut,
    against_head,
    blob_key,
    checkpoint_key,
    newest_key,
    whole_blob,
    whole_entries,
    writes_key,
)
from eventstore.integrations.langgraph_state import PROJECTIONS as STATE_PROJECTIONS
from eventstore.ops.seek import can_seek
from eventstore.session_ids import validate_session_id
from eventstore.store import SessionStore

# a read of a named checkpoint from the log: (store, session, namespace, id)
_OlderRead = Callable[[SessionStore, str, str, str], OlderCheckpoint | None]

#: What the saver's store folds: every checkpoint, each namespace's newest, and where
#: the lines are (`langgraph_lines`).
PROJECTIONS = (*STATE_PROJECTIONS, LINES_PROJECTION)

__all__ = [
    "EVENT_TYPES",
    "HEAD_PROJECTION",
    "LINES_PROJECTION",
    "PROJECTION",
    "PROJECTIONS",
    "CheckpointPut",
    "CheckpointsRemoved",
    "EventStoreSaver",
    "LangGraphHeadProjection",
    "LangGraphProjection",
    "ThreadCopied",
    "WritesPut",
]


_Entries = list[CheckpointEntry]  # named here: inside the saver, `list` is its method


# -- the saver -------------------------------------------------------------------------


class EventStoreSaver(BaseCheckpointSaver[str]):
    """A LangGraph `BaseCheckpointSaver` over an eventstore store, sync and async.

    `store_or_url` is an open `SessionStore` (which it teaches its event types and
    projections with `SessionStore.learn`, then shares and never closes) or what
    `SessionStore` takes (a directory or a store URL), opened here with those and
    closed by `close()`. Each thread is the session
    `thread_prefix + thread_id`. Usable as a (sync or async) context manager.

    `delta_blobs` (default True): a changed channel's blob is stored as its change from
    the blob of the same channel in the thread's newest checkpoint where that saves most
    of its bytes (a message list grown by a message), so a thread's log grows linearly
    with its steps; such a log needs a release that reads deltas. False: every blob
    whole, a log any release reads.
    """

    def __init__(
        self,
        store_or_url: SessionStore | str | os.PathLike[str],
        *,
        thread_prefix: str = "langgraph-",
        serde: SerializerProtocol | None = None,
        max_workers: int = 4,
        delta_blobs: bool = True,
    ) -> None:
        super().__init__(serde=serde)
        self.delta_blobs = delta_blobs
        if isinstance(store_or_url, SessionStore):
            store_or_url.learn(EVENT_TYPES, PROJECTIONS)
            self.store = store_or_url
            self._owns_store = False
        else:
            self.store = SessionStore(
                store_or_url, event_types=EVENT_TYPES, projections=PROJECTIONS
            )
            self._owns_store = True
        self.thread_prefix = thread_prefix
        self.aio = AsyncSessionStore(self.store, max_workers=max_workers)
        # sessions whose head cannot be folded: a snapshot from before the head
        # projection existed opens the log, and no archive holds what it replaced
        self._no_head: set[str] = set()
        # sessions whose index of lines this saver does not keep (`_keep_lines_current`)
        self._no_lines: set[str] = set()

    # -- lifecycle ----------------------------------------------------------------------

    def close(self) -> None:
        """Close the store if this saver opened it."""
        if self._owns_store:
            self.store.close()

    def __enter__(self) -> EventStoreSaver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> EventStoreSaver:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aio.close()
        self.close()

    # -- where a thread lives -----------------------------------------------------------

    def session_id(self, thread_id: str) -> str:
        """The eventstore session holding `thread_id`'s checkpoints."""
        return f"{self.thread_prefix}{thread_id}"

    def thread_ids(self) -> list[str]:
        """Every thread with a session in the store."""
        n = len(self.thread_prefix)
        return [s[n:] for s in self.store.list_sessions() if s.startswith(self.thread_prefix)]

    def _state(self, thread_id: str) -> State:
        return cast(State, self.store.load(self.session_id(thread_id), PROJECTION))

    def _heads(self, thread_id: str) -> HeadState | None:
        """The thread's head state; None when it cannot be folded (see `_no_head`)."""
        sid = self.session_id(thread_id)
        if sid in self._no_head:
            return None
        try:
            heads = cast(HeadState, self.store.load(sid, HEAD_PROJECTION))
        except SnapshotVersionError:
            _mark(self._no_head, sid)
            return None
        return heads

    def _keep_head_current(self, thread_id: str) -> None:
        """Load the thread's head once, so the appends of this saver advance it and
        `close` leaves it in the fold cache for the next process (a writer that never
        reads, such as a bulk import, would otherwise leave none); and its index of
        lines, where that comes cheap (`_keep_lines_current`)."""
        sid = self.session_id(thread_id)
        # once folded, the store keeps the head current through every append and saves
        # it in the fold cache on close, for as long as it keeps the session
        if not core_of(self.store).has_fold(sid, HEAD_PROJECTION.name):
            self._heads(thread_id)
        if sid not in self._no_lines:
            self._keep_lines_current(sid)

    def _keep_lines_current(self, sid: str) -> None:
        """Keep the thread's index of lines (`langgraph_lines`) folded where that comes
        cheap (the store keeps it, or a cache of it, or the thread is new), so this
        saver's appends advance it and its cache stays current for other processes'
        reads of named checkpoints. A thread written before the index existed has none
        (its named reads search the log instead), nor has an engine that cannot read a
        line by its seq: neither is asked again."""
        core = core_of(self.store)
        if not can_seek(core) or core.has_fold(sid, LINES_PROJECTION.name):
            return
        if not core.loaded_if_kept(sid, LINES_PROJECTION, lambda index: True):
            _mark(self._no_lines, sid)

    def _forget(self, thread_id: str) -> None:
        sid = self.session_id(thread_id)
        self._no_head.discard(sid)
        self._no_lines.discard(sid)

    # -- reads --------------------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint named by `config` (the thread's newest in its namespace when
        it names none), with its channel values and pending writes; None if absent."""
        conf = config["configurable"]
        thread_id = str(conf["thread_id"])
        ns = conf.get("checkpoint_ns", "")
        checkpoint_id = get_checkpoint_id(config)
        if checkpoint_id:
            indexed = self._older(thread_id, ns, checkpoint_id, indexed_checkpoint)
            if indexed is not None:
                found = indexed.found
                return None if found is None else self._tuple_of(thread_id, found)
        heads = self._heads(thread_id)
        if heads is not None:
            known = heads.get(ns)
            if known is None or known.max_id is None:
                return None  # no checkpoint was ever put in the namespace
            if checkpoint_id and checkpoint_id > known.max_id:
                return None  # no checkpoint with an id that large was ever put
            head = known.head
            if head is not None and checkpoint_id in (None, "", head.checkpoint.checkpoint_id):
                if not head.checkpoint.checkpoint_id:
                    return None  # as the full index answers: an empty id names nothing
                return self._tuple_of(thread_id, head)
        if checkpoint_id:
            older = self._older(thread_id, ns, checkpoint_id, older_checkpoint)
            if older is not None:
                found = older.found
                return None if found is None else self._tuple_of(thread_id, found)
        state = self._state(thread_id)
        if not checkpoint_id:
            newest = state.get(newest_key(ns))
            checkpoint_id = newest.checkpoint_id if isinstance(newest, NewestEntry) else None
        entry = state.get(checkpoint_key(ns, checkpoint_id)) if checkpoint_id else None
        if not isinstance(entry, CheckpointEntry):
            return None
        return self._tuple_in(thread_id, entry, state)

    def _older(
        self, thread_id: str, ns: str, checkpoint_id: str, read: _OlderRead
    ) -> OlderCheckpoint | None:
        """A named checkpoint `read` from the thread's log (the lines its index of lines
        names: `indexed_checkpoint`; those a search of the log finds: `older_checkpoint`)
        when this store has not folded its full index; None: read another way."""
        sid = self.session_id(thread_id)
        if core_of(self.store).has_fold(sid, PROJECTION.name):
            return None  # warm: a lookup in the folded index, brought up to date
        return read(self.store, sid, ns, checkpoint_id)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first: of one thread (or all), one namespace (if the
        config names one), before a checkpoint, whose metadata has `filter`'s values."""
        conf = config["configurable"] if config else {}
        threads = [str(conf["thread_id"])] if "thread_id" in conf else self.thread_ids()
        ns_wanted = conf.get("checkpoint_ns")
        id_wanted = get_checkpoint_id(config) if config else None
        before_id = get_checkpoint_id(before) if before else None
        remaining = limit
        for thread_id in threads:
            state = self._state(thread_id)
            entries = sorted(
                (e for e in state.values() if isinstance(e, CheckpointEntry)),
                key=lambda e: (e.ns, e.checkpoint_id),
            )
            by_ns: dict[str, list[CheckpointEntry]] = {}
            for e in entries:
                by_ns.setdefault(e.ns, []).append(e)
            for ns, in_ns in by_ns.items():
                if ns_wanted is not None and ns != ns_wanted:
                    continue
                for e in reversed(in_ns):
                    if id_wanted and e.checkpoint_id != id_wanted:
                        continue
                    if before_id and e.checkpoint_id >= before_id:
                        continue
                    metadata = self._load(e.metadata) if filter else None
                    if filter and not all(
                        cast(dict[str, Any], metadata).get(k) == v for k, v in filter.items()
                    ):
                        continue
                    if remaining is not None:
                        if remaining <= 0:
                            return
                        remaining -= 1
                    yield self._tuple_in(thread_id, e, state, metadata)

    def _tuple_in(
        self, thread_id: str, e: CheckpointEntry, state: State, metadata: Any = None
    ) -> CheckpointTuple:
        """The tuple of checkpoint `e` of the full index `state`."""

        def blob_of(channel: str, version: str) -> BlobEntry | None:
            return whole_blob(state.get(blob_key(e.ns, channel, version)))

        writes = state.get(writes_key(e.ns, e.checkpoint_id))
        return self._tuple(
            thread_id, e, blob_of, writes if isinstance(writes, WritesEntry) else None, metadata
        )

    def _tuple_of(self, thread_id: str, head: HeadEntry) -> CheckpointTuple:
        """The tuple of a checkpoint held with its blobs, by channel, and its writes."""
        blobs = head.blobs
        return self._tuple(
            thread_id, head.checkpoint, lambda channel, version: blobs.get(channel), head.writes
        )

    def _tuple(
        self,
        thread_id: str,
        e: CheckpointEntry,
        blob_of: Callable[[str, str], BlobEntry | None],
        writes: WritesEntry | None,
        metadata: Any = None,
    ) -> CheckpointTuple:
        """Checkpoint `e` decoded, with the values of its blobs (`blob_of(channel,
        version)`) and its pending writes."""
        # the serde's call bound once, not through `_load` per value: a `list` of a long
        # thread builds thousands of these
        loads = self.serde.loads_typed
        checkpoint: Checkpoint = loads((e.checkpoint.type, e.checkpoint.data))
        values: dict[str, Any] = {}
        for channel, version in e.versions.items():
            blob = blob_of(channel, version)
            if blob is not None and (value := blob.value) is not None:
                values[channel] = loads((value.type, value.data))
        checkpoint["channel_values"] = values
        pending = (
            [(w.task_id, w.channel, loads((w.value.type, w.value.data))) for w in writes.writes]
            if writes is not None
            else []
        )
        if metadata is None:
            metadata = loads((e.metadata.type, e.metadata.data))
        return CheckpointTuple(
            _config(thread_id, e.ns, e.checkpoint_id),
            checkpoint,
            metadata,
            _config(thread_id, e.ns, e.parent_id) if e.parent_id else None,
            pending,
        )

    # -- writes -------------------------------------------------------------------------

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store a checkpoint and the blobs of `new_versions`, as one atomic append."""
        conf = config["configurable"]
        thread_id = str(conf["thread_id"])
        ns = conf.get("checkpoint_ns", "")
        stored: dict[str, Any] = dict(checkpoint)
        values: dict[str, Any] = stored.pop("channel_values", {})
        full_metadata = get_checkpoint_metadata(config, metadata)
        run_id = full_metadata.get("run_id")
        blobs = [
            BlobPut(ch, _version(v), self._dump(values[ch]) if ch in values else None)
            for ch, v in new_versions.items()
        ]
        dumped, dumped_metadata = self._dump(stored), self._dump(full_metadata)

        def put_of(blobs: list[BlobPut]) -> CheckpointPut:
            return CheckpointPut(
                ns=ns,
                checkpoint_id=checkpoint["id"],
                parent_id=conf.get("checkpoint_id"),
                run_id=str(run_id) if run_id is not None else None,
                versions={ch: _version(v) for ch, v in checkpoint["channel_versions"].items()},
                checkpoint=dumped,
                metadata=dumped_metadata,
                blobs=blobs,
            )

        self._keep_head_current(thread_id)
        sid = self.session_id(thread_id)
        if self.delta_blobs and sid not in self._no_head:
            try:
                # each changed channel's blob as a delta against the head checkpoint's
                # blob of it, judged at the exact head the append commits at (the
                # projections apply it over the same blob): one round trip when this
                # store's head state is current, as after its own last put
                self.store.append_decided(
                    sid, HEAD_PROJECTION, lambda heads: [put_of(against_head(blobs, heads.get(ns)))]
                )
                return _config(thread_id, ns, checkpoint["id"])
            except SnapshotVersionError:  # raised before anything is written
                _mark(self._no_head, sid)
        self.store.append(sid, [put_of(blobs)])
        return _config(thread_id, ns, checkpoint["id"])

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's writes against a checkpoint, as one atomic append; writing
        the same (task, index) twice keeps the first."""
        if not writes:
            return
        conf = config["configurable"]
        event = WritesPut(
            ns=conf.get("checkpoint_ns", ""),
            checkpoint_id=str(conf["checkpoint_id"]),
            writes=[
                WriteRecord(task_id, WRITES_IDX_MAP.get(ch, i), ch, self._dump(v), task_path)
                for i, (ch, v) in enumerate(writes)
            ],
        )
        self._keep_head_current(str(conf["thread_id"]))
        self.store.append(self.session_id(str(conf["thread_id"])), [event])

    def delete_thread(self, thread_id: str) -> None:
        """Delete the thread's session: its checkpoints, writes, history and bytes."""
        self.store.delete_session(self.session_id(str(thread_id)))
        self._forget(str(thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Remove every checkpoint (and its writes) whose metadata has one of `run_ids`,
        in every thread: one atomic append per thread that has any. A single str (or
        bytes) is refused (InvalidArgumentError, a TypeError as `prune` raises): taken as a
        sequence, its characters would name other runs to delete."""
        _refuse_str(run_ids, "run_ids", "run IDs")
        wanted = {str(r) for r in run_ids}
        if not wanted:
            return
        for thread_id in self.thread_ids():
            self._remove(
                thread_id,
                lambda entries: [e for e in entries if e.run_id in wanted],
                "delete_for_runs",
            )

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint and write of one thread into another, as one append."""
        entries = whole_entries(self._state(str(source_thread_id)))
        if entries:
            self.store.append(
                self.session_id(str(target_thread_id)),
                [ThreadCopied(source_thread_id=str(source_thread_id), entries=entries)],
            )

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """`"keep_latest"`: keep each namespace's newest checkpoint, then compact the
        thread without an archive so the pruned bytes leave the live log (archives an
        earlier compaction made are kept), a kept checkpoint whose parent went left with
        no parent (as PostgresSaver's); a thread a graph with a `DeltaChannel` wrote
        is refused (NotImplementedError, no thread pruned). `"delete"`: delete the
        threads. A single str (or bytes) is refused (InvalidArgumentError, a TypeError as
        PostgresSaver raises): taken as a sequence, its characters would name other
        threads to prune or delete. A bad id (InvalidSessionIdError) is refused before
        any thread is touched."""
        _refuse_str(thread_ids, "thread_ids", "thread IDs")
        # read once: an iterator (a generator) would be spent by the DeltaChannel check,
        # leaving nothing to prune
        thread_ids = [str(t) for t in thread_ids]
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f"prune strategy must be 'keep_latest' or 'delete', not {strategy!r}")
        for t in thread_ids:  # a bad id refused before any thread is touched
            validate_session_id(self.session_id(t))
        if strategy == "keep_latest":
            # a DeltaChannel's value is rebuilt from older checkpoints' writes: kept alone,
            # the newest would read it empty. Refused before any thread is pruned, as
            # PostgresSaver refuses it
            delta = [str(t) for t in thread_ids if self._uses_delta_channels(str(t))]
            if delta:
                raise NotImplementedError(
                    f"keep_latest can't prune threads that use a DeltaChannel: {', '.join(delta)}"
                )
        for thread_id in thread_ids:
            if strategy == "delete":
                self.delete_thread(thread_id)
            elif self._remove(str(thread_id), _all_but_newest, PRUNED, unparent=True):
                # forced: the pruned bytes must leave the log even where a snapshot
                # would not be smaller
                self.store.compact(self.session_id(str(thread_id)), archive=False, force=True)
                # the compaction restarted the store's folds, and its snapshot holds a head
                self._forget(str(thread_id))

    def _uses_delta_channels(self, thread_id: str) -> bool:
        """Whether a graph with a `DeltaChannel` put a checkpoint of the thread (LangGraph
        counts in its metadata the steps since each such channel's last snapshot)."""
        for e in self._state(thread_id).values():
            if isinstance(e, CheckpointEntry):
                metadata = self._load(e.metadata)
                if isinstance(metadata, dict) and _DELTA_METADATA & metadata.keys():
                    return True
        return False

    def _remove(
        self,
        thread_id: str,
        select: Callable[[_Entries], _Entries],
        reason: str,
        *,
        unparent: bool = False,
    ) -> bool:
        """Append the removal of the thread's checkpoints `select` picks; `unparent`: the
        ones kept whose parent is not kept lose it (a prune's, as PostgresSaver's)."""
        entries = [e for e in self._state(thread_id).values() if isinstance(e, CheckpointEntry)]
        gone = [(e.ns, e.checkpoint_id) for e in select(entries)]
        kept = {(e.ns, e.checkpoint_id) for e in entries} - set(gone)
        # (a parent gone before, by delete_for_runs, is not kept either)
        orphans = [
            (e.ns, e.checkpoint_id)
            for e in entries
            if unparent
            and (e.ns, e.checkpoint_id) in kept
            and e.parent_id is not None
            and (e.ns, e.parent_id) not in kept
        ]
        if not gone and not orphans:
            return False
        self.store.append(
            self.session_id(thread_id),
            [CheckpointsRemoved(checkpoints=gone, reason=reason, unparented=orphans)],
        )
        return True

    # -- async: the same calls, in the thread's lane of the async store ------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """`get_tuple` without blocking the event loop."""
        return await self.aio.call(self._lane(config), lambda: self.get_tuple(config))

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """`list` without blocking the event loop (read in a worker, then yielded)."""
        found = await self.aio.call(
            self._lane(config),
            lambda: list(self.list(config, filter=filter, before=before, limit=limit)),
        )
        for tup in found:
            yield tup

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """`put` without blocking the event loop."""
        return await self.aio.call(
            self._lane(config), lambda: self.put(config, checkpoint, metadata, new_versions)
        )

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """`put_writes` without blocking the event loop."""
        await self.aio.call(
            self._lane(config), lambda: self.put_writes(config, writes, task_id, task_path)
        )

    async def adelete_thread(self, thread_id: str) -> None:
        """`delete_thread` without blocking the event loop."""
        await self.aio.call(self.session_id(thread_id), lambda: self.delete_thread(thread_id))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """`delete_for_runs` without blocking the event loop."""
        await self.aio.call(_EVERY_THREAD, lambda: self.delete_for_runs(run_ids))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """`copy_thread` without blocking the event loop (in the target's lane)."""
        await self.aio.call(
            self.session_id(target_thread_id),
            lambda: self.copy_thread(source_thread_id, target_thread_id),
        )

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """`prune` without blocking the event loop."""
        await self.aio.call(_EVERY_THREAD, lambda: self.prune(thread_ids, strategy=strategy))

    def _lane(self, config: RunnableConfig | None) -> str:
        conf = config["configurable"] if config else {}
        return self.session_id(str(conf["thread_id"])) if "thread_id" in conf else _EVERY_THREAD

    # -- versions and values ------------------------------------------------------------

    def get_next_version(self, current: str | None, channel: None) -> str:
        """A string version `<counter>.<random>`: increasing, and unique across forks."""
        if current is None:
            n = 0
        elif isinstance(current, int):
            n = current
        else:
            n = int(str(current).split(".")[0])
        return f"{n + 1:032}.{random.random():016}"

    def _dump(self, value: Any) -> TypedValue:
        type_name, data = self.serde.dumps_typed(value)
        return TypedValue(type_name, data)

    def _load(self, value: TypedValue) -> Any:
        return self.serde.loads_typed((value.type, value.data))


# the metadata keys LangGraph writes for a graph with a DeltaChannel (as PostgresSaver
# tells such a thread from them)
_DELTA_METADATA = frozenset({"counters_since_delta_snapshot", "delta_writes_versioned"})

# a lane key for calls that span threads; no session id can equal it (ids are non-empty)
_EVERY_THREAD = ""


def _refuse_str(ids: Sequence[str], name: str, what: str) -> None:
    """A str where a sequence of ids goes is refused, as PostgresSaver's prune refuses
    one (its message), before anything is removed; so are bytes, whose items (ints)
    would name other ids as their digits."""
    if isinstance(ids, (str, bytes, bytearray)):
        kind = "a str" if isinstance(ids, str) else type(ids).__name__
        raise InvalidArgumentError(f"{name} must be a sequence of {what}, not {kind}: {ids!r}")


def _all_but_newest(entries: list[CheckpointEntry]) -> list[CheckpointEntry]:
    newest: dict[str, str] = {}
    for e in entries:
        newest[e.ns] = max(e.checkpoint_id, newest.get(e.ns, ""))
    return [e for e in entries if e.checkpoint_id != newest[e.ns]]


def _version(v: str | int | float) -> str:
    return msgspec.json.encode(v).decode()


def _config(thread_id: str, ns: str, checkpoint_id: str) -> RunnableConfig:
    return {
        "configurable": {
            "thread_id": thread_id,
            "checkpoint_ns": ns,
            "checkpoint_id": checkpoint_id,
        }
    }


# the most sessions a saver remembers it need not try again (`_no_head`, `_no_lines`):
# past it, it forgets them all and asks again as it meets them (a long-lived saver over
# many threads never grows without bound)
MARKS_MAX = 10_000


def _mark(marks: set[str], sid: str) -> None:
    """Remember `sid` in `marks`, forgetting every other one past `MARKS_MAX`."""
    if len(marks) >= MARKS_MAX:
        marks.clear()
    marks.add(sid)
