"""`SessionStore`: the session API over a storage engine (the face).

Each session's projections are cached with the engine position they were folded to, so
a repeated load folds only what was appended since, by this process or another. Every
line a load folds is checked against the hash chain (`eventstore.format.reader`). Writes go
through one path (`_write`): fold what the command must be validated against, build the
events, encode them chained to the head that fold reached, and ask the engine to append
them against that head; if another writer moved the head meanwhile, catch up and try
again (the engine writes nothing on a moved head). The caches that were current are
advanced by the appended events without reading them back.
"""

from __future__ import annotations

import enum
import hashlib
import logging
import os
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from eventstore.core import checked_prefix, fold_cache
from eventstore.core.frozen import maker
from eventstore.core.gc_pause import paused_gc
from eventstore.core.side_thread import start_side_thread
from eventstore.engines.base import (
    EMPTY_HEAD,
    Durability,
    EncodedBatch,
    Engine,
    Head,
    HeadMovedError,
    ReadResult,
    open_engine,
)
from eventstore.engines.file.layout import validate_session_id
from eventstore.errors import (
    ConcurrencyError,
    EventStoreError,
    FeatureNotFoundError,
    HistoryUnavailableError,
    IdempotencyConflictError,
    InvalidArgumentError,
    InvalidRecordError,
    StoreClosedError,
    UnknownProjectionError,
)
from eventstore.format.events import (
    ArchivePruned,
    CheckpointRecorded,
    Event,
    EventCodec,
    FeatureListReplaced,
    FeaturePassUpdated,
    ManifestSet,
    MessagesAppended,
    NotAsStoredError,
    ProgressAppended,
    Snapshot,
    UnknownEvent,
    Upcaster,
    event_tag,
    validated_copy,
)
from eventstore.format.reader import read_lines
from eventstore.ops.history import fold_events
from eventstore.records import (
    BootstrapState,
    FeatureRecord,
    Message,
    ProgressEntry,
    RunCheckpoint,
    SessionManifest,
)
from projections import (
    BootstrapProjection,
    IdempotencyProjection,
    Projection,
    TranscriptProjection,
    fold,
)

if TYPE_CHECKING:
    from eventstore.ops.compaction import CompactionReport
    from eventstore.ops.verify import VerifyReport
    from projections import Retention

__all__ = ["AppendResult", "AutoCompact", "SessionStore"]

log = logging.getLogger("eventstore")
S = TypeVar("S")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class AutoCompact:
    """Compact a session after an append once its log passes either threshold.

    Off unless given to `SessionStore(auto_compact=...)`. `retention` is applied at
    each automatic compaction; None keeps everything.
    """

    max_bytes: int | None = None
    max_events: int | None = None
    archive: bool = True
    retention: Retention | None = None

    def due(self, size: int, events: int) -> bool:
        """Whether a log of `size` bytes holding `events` lines passes a threshold."""
        return (self.max_bytes is not None and size >= self.max_bytes) or (
            self.max_events is not None and events >= self.max_events
        )


@dataclass(frozen=True, slots=True)
class AppendResult:
    """What an append wrote: its first and last sequence numbers. `replayed` is True when
    the idempotency key had been seen and nothing was written this time."""

    first_seq: int
    last_seq: int
    replayed: bool = False


class _Fold:
    """One projection's state of one session and the head it was folded to. `saved`: the
    head the persistent fold cache holds, as far as this process knows (None: unknown),
    so a cache is written only when it would hold something new."""

    __slots__ = ("head", "saved", "state")

    def __init__(self, state: Any, head: Head, saved: Head | None = None) -> None:
        self.state = state
        self.head = head
        self.saved = saved


class _Session:
    """What the store keeps per session: its folded projections, the last head seen, and
    the checked prefix of its live log this process can vouch for (engines with a
    cache only; see eventstore.core.checked_prefix)."""

    __slots__ = (
        "auto_floor",
        "checked_snapshots",
        "folds",
        "head",
        "kept_from_creation",
        "lock",
        "prefix",
        "session_id",
    )

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.lock = threading.RLock()
        self.folds: dict[str, _Fold] = {}
        self.head: Head | None = None  # the newest head this process saw (may be stale)
        self.prefix: checked_prefix.Prefix | None = None
        # snapshot lines a cold page checked whole: by `h`, the digests of the blocks
        # its cut read (eventstore.ops.paging)
        self.checked_snapshots: dict[bytes, dict[int, bytes]] = {}
        # after an automatic compaction skipped as not shrinking: the live log it read
        # (its first seq) and twice its size, below which it is not tried again
        self.auto_floor = (0, 0)
        # log bytes folded into the states this store started when it created the session
        # (counted against the store's KEPT_FROM_CREATION budget); -1: none kept that way
        self.kept_from_creation = -1


class _PrefixMismatch(Exception):
    """A checked prefix did not prove the bytes a load trusted: fold again, checking."""


# a build function: given the head and the folded states asked for, the events to append
Build = Callable[[Head, list[Any]], list[Event]]

_stores: weakref.WeakSet[SessionStore] = weakref.WeakSet()

# when the persistent fold cache (eventstore.core.fold_cache) is written: after a fold that
# read at least this many bytes of log, and on close for a fold whose log is at least
# _CACHE_ON_CLOSE_BYTES long (below that a cold fold costs about what reading a cache
# does, and close stays free of fsyncs for small sessions)
_CACHE_AFTER_FOLD_BYTES = 1 << 20
# how much log a load reads and folds at a time (see Engine.read_some): bounds what a
# cold load of a long log holds besides the state it builds
_READ_PIECE = 1 << 20
# a checked prefix's bytes are hashed on a side thread, beside their decoding, from this
# many bytes in a piece (below it the thread's start costs more than it hides)
_HASH_ASIDE = 128 << 10
_NO_PAUSE = nullcontext()  # a warm load folds only a tail: the collector stays on
_CACHE_ON_CLOSE_BYTES = 64 << 10
KEPT_FROM_CREATION = 64 << 20
"""Bytes of log a store folds, as it appends them, into the transcripts of sessions it
created and never loaded (their caches are saved on close); past it, it lets them go."""


def _after_fork_in_child() -> None:
    # a session lock held by another thread of the parent at the fork stays held in the
    # child forever: give every store fresh ones. That thread may also have been between
    # updating a cached state and its head: the child refolds from the engine.
    for store in list(_stores):
        store._guard = threading.Lock()
        store._kept_bytes = 0
        for sess in list(store._sessions.values()):
            sess.lock = threading.RLock()
            sess.folds = {}
            sess.head = None
            sess.prefix = None
            sess.kept_from_creation = -1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class SessionStore:
    """Durable per-session memory for agent harnesses, kept as append-only event logs.

    `root` is a store URL or path (see `eventstore.engines`): a directory (created 0700
    if missing) or `file:///abs/dir` for the file engine, `memory://` or `memory://NAME`
    for memory, `postgresql://...` for PostgreSQL; or an `Engine` instance. `durability`
    is "flush" (every append reaches the OS before it returns: survives a killed
    process) or "fsync" (every append is flushed to the disk before it returns:
    survives power loss). `event_types`,
    `projections` and `upcasters` extend the store with custom events, custom folds and
    readers of old event versions. `auto_compact` (off by default) compacts a session
    after an append once its log passes a size or event-count threshold.
    `cached_sessions`: how many sessions' folded states the store keeps in memory; past
    it, the oldest opened are dropped (their caches saved first) and refold on next use. Usable as a
    context manager; safe to share between threads; any number of processes may open
    the same file or database store.

    The bootstrap projection's state, and that of any projection with a true
    `cache_folds` attribute (the transcript's is one), is kept between processes in the
    engine's fold cache (`eventstore.core.fold_cache`; the file engine keeps it beside the
    log): a cold load folds only what was appended after it. It is written on `close`
    (a store that creates a session folds its transcript as it appends, within
    `KEPT_FROM_CREATION`), after a long fold and by compaction, and used only when it
    checks against the log; a state kept in frames (the transcript's, about as large as
    the log) is written on `close` and by compaction only, once the log has grown by an
    eighth. A cold load of the built-in projections, and of any with a true `pause_gc`
    attribute (whose folds make no cyclic garbage), runs with the cyclic garbage
    collector paused (`eventstore.core.gc_pause`).
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | Engine,
        durability: Durability = "flush",
        *,
        event_types: Iterable[type[Event]] = (),
        projections: Iterable[Projection[Any]] = (),
        upcasters: Iterable[tuple[type[Event], int, Upcaster]] = (),
        auto_compact: AutoCompact | None = None,
        cached_sessions: int = 1000,
    ) -> None:
        if durability not in ("flush", "fsync"):
            raise InvalidArgumentError(f"durability must be 'flush' or 'fsync', not {durability!r}")
        self.durability: Durability = durability
        self.engine: Engine = (
            root if isinstance(root, Engine) else open_engine(root, durability=durability)
        )
        self.url = self.engine.url
        engine_root = getattr(self.engine, "root", None)
        # the directory of a file store (None for other engines)
        self.root: Path | None = engine_root if isinstance(engine_root, Path) else None
        self.codec = EventCodec(event_types)
        for cls, version, fn in upcasters:
            self.codec.register_upcaster(cls, version, fn)
        self.bootstrap = BootstrapProjection()
        self.transcript = TranscriptProjection()
        self.idempotency = IdempotencyProjection()
        self._projections: dict[str, Projection[Any]] = {}
        builtin: list[Projection[Any]] = [self.bootstrap, self.transcript, self.idempotency]
        for p in (*builtin, *projections):
            if p.name in self._projections:
                raise InvalidArgumentError(f"two projections are named {p.name!r}")
            self._projections[p.name] = p
        self.auto_compact = auto_compact
        if type(cached_sessions) is not int or cached_sessions < 1:
            raise InvalidArgumentError(
                f"cached_sessions must be an int >= 1, got {cached_sessions!r}"
            )
        self.cached_sessions = cached_sessions
        # the projections whose folds the engine's fold cache keeps, each with the event
        # types this store decodes of those it reads and how it upcasts them (a cache
        # folded knowing others, or upcasting another way, is another state:
        # eventstore.core.fold_cache)
        self._cached = {
            name: fold_cache.known_types(p, self.codec.types, self.codec.reading)
            for name, p in self._projections.items()
            if p is self.bootstrap or getattr(p, "cache_folds", False) is True
        }
        # those kept in frames (a transcript's: large states, written on close only)
        self._framed = frozenset(
            n for n in self._cached if fold_cache.is_framed(self._projections[n])
        )
        # the projections whose cold folds run with the cyclic collector paused: the
        # built-in ones, and those whose authors say their folds make no cyclic garbage
        self._pause_gc = frozenset(
            name
            for name, p in self._projections.items()
            if p in builtin or getattr(p, "pause_gc", False) is True
        )
        # the built-in projections, which never change an event they are given: they
        # share an append's events; every other fold gets events of its own
        self._builtin = frozenset(p.name for p in builtin)
        # whether the engine keeps caches, so checked prefixes are worth keeping
        self._marks = type(self.engine).store_cache is not Engine.store_cache
        self._kept_bytes = 0  # see _keep_from_creation
        self._sessions: dict[str, _Session] = {}
        self._guard = threading.Lock()
        self._closed = False
        _stores.add(self)

    # -- lifecycle --------------------------------------------------------------------

    def close(self) -> None:
        """Save the fold caches worth saving, forget cached state and release the engine.
        Every append is already written: the caches only save later loads time."""
        with self._guard:
            sessions = list(self._sessions.values()) if not self._closed else []
            self._sessions.clear()
        for sess in sessions:
            self._save_caches(sess)
        with self._guard:
            if not self._closed:
                self._closed = True
                self.engine.close()

    def _save_caches(self, sess: _Session) -> None:
        """Save what is worth saving of a session this store stops keeping: the fold
        caches that would hold something new, and the checked prefix."""
        if sess.lock._is_owned():  # type: ignore[attr-defined]
            # this thread is folding into it (a load nested in a projection's fold
            # evicted it): its states may be half folded, its prefix unproven
            return
        with sess.lock:
            for name, f in sess.folds.items():
                if self._worth_saving(name, f):
                    self._save_fold(sess.session_id, name, f.state, f.head)
            p = sess.prefix
            if p is not None and p.size != p.saved and p.size >= _CACHE_ON_CLOSE_BYTES:
                checked_prefix.store(self.engine, sess.session_id, p)

    def _keep_from_creation(self, sess: _Session, head: Head) -> None:
        """The session is being created by this store: start, at its empty head, the
        built-in states the fold cache keeps that it has not (the transcript, unless
        the caller loaded it), so that what it appends is folded as it goes and close
        saves their caches: the next process's cold load then reads those, not the log.
        Within a budget (`KEPT_FROM_CREATION` bytes of log a store), past which a
        session's kept transcript is let go (an importer of many sessions)."""
        if self._kept_bytes >= KEPT_FROM_CREATION:
            return
        started = False
        for name in self._cached:
            if name in self._builtin and name not in sess.folds:
                sess.folds[name] = _Fold(self._projections[name].initial(), head)
                started = True
        if started:
            sess.kept_from_creation = 0

    def _count_kept(self, sess: _Session, n: int) -> None:
        """`n` more bytes folded into the states kept from the session's creation; past
        the store's budget, its transcript (the large one) is let go."""
        sess.kept_from_creation += n
        self._kept_bytes += n
        if self._kept_bytes > KEPT_FROM_CREATION:
            name = self.transcript.name
            if name in sess.folds and sess.folds[name].saved is None:
                del sess.folds[name]
            self._kept_bytes -= sess.kept_from_creation
            sess.kept_from_creation = -1

    def _worth_saving(self, name: str, f: _Fold) -> bool:
        """Whether the fold cache of projection `name` should now hold `f`: it holds an
        older head, and the log is not too short to gain from a cache. A framed state
        (a transcript's) costs about the log's size to write, so it is rewritten only
        once the log has grown by an eighth since the head it holds."""
        if name not in self._cached or f.head.size < _CACHE_ON_CLOSE_BYTES:
            return False
        saved = f.saved
        if saved is None:
            return True
        if saved.seq == f.head.seq:
            return False
        if name in self._framed and f.head.size >= saved.size:
            return (f.head.size - saved.size) * 8 >= saved.size
        return True

    def __enter__(self) -> SessionStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def projections(self) -> dict[str, Projection[Any]]:
        """The projections this store folds, by name (built-in and user-defined)."""
        return dict(self._projections)

    # -- the session API --------------------------------------------------------------

    def is_initialized(self, session_id: str, *, idempotency_key: str | None = None) -> bool:
        """True once the session has a manifest. (`idempotency_key` is accepted so every
        session operation has the same shape; reads are idempotent anyway.)"""
        return self._loaded(session_id, self.bootstrap, _has_manifest)

    def initialize_session_if_missing(
        self,
        session_id: str,
        manifest: SessionManifest,
        feature_list: Sequence[FeatureRecord],
        initial_progress_entry: ProgressEntry | None = None,
        initial_checkpoint: RunCheckpoint | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> bool:
        """Write manifest, feature list and the optional first entries as one atomic batch.

        Returns False, writing nothing, if the session already has a manifest; when
        several processes race, exactly one gets True.
        """
        events: list[Event] = [
            ManifestSet(manifest=_manifest_of(session_id, manifest)),
            FeatureListReplaced(features=_features(feature_list, "feature_list")),
        ]
        if initial_progress_entry is not None:
            entry = validated_copy(initial_progress_entry, ProgressEntry, "initial_progress_entry")
            events.append(ProgressAppended(entry=entry))
        if initial_checkpoint is not None:
            cp = validated_copy(initial_checkpoint, RunCheckpoint, "initial_checkpoint")
            events.append(CheckpointRecorded(checkpoint=cp))

        def build(head: Head, states: list[Any]) -> list[Event]:
            return [] if states[0].manifest is not None else events

        # a replayed key means an earlier call with this key initialized the session
        result = self._write(session_id, build, idempotency_key, (self.bootstrap,), events)
        return result is not None

    def load_bootstrap_state(
        self, session_id: str, *, idempotency_key: str | None = None
    ) -> BootstrapState:
        """The manifest, features, progress and checkpoints; `BootstrapState()` if unknown."""
        return self._loaded(session_id, self.bootstrap, self.bootstrap.copy)

    def save_manifest(
        self, session_id: str, manifest: SessionManifest, *, idempotency_key: str | None = None
    ) -> AppendResult:
        """Replace the session's manifest (whose `session_id` must be this session's)."""
        ev = ManifestSet(manifest=_manifest_of(session_id, manifest))
        return self._write_events(session_id, [ev], idempotency_key)

    def append_progress_entry(
        self, session_id: str, entry: ProgressEntry, *, idempotency_key: str | None = None
    ) -> AppendResult:
        """Append a progress note."""
        return self._write_records(
            session_id,
            lambda e: ProgressAppended(entry=e),
            entry if type(entry) is ProgressEntry else None,
            lambda: validated_copy(entry, ProgressEntry, "entry"),
            idempotency_key,
        )

    def replace_feature_list(
        self,
        session_id: str,
        features: Sequence[FeatureRecord],
        *,
        idempotency_key: str | None = None,
    ) -> AppendResult:
        """Replace the whole feature list; order is kept, ids must be unique."""
        ev = FeatureListReplaced(features=_features(features, "features"))
        return self._write_events(session_id, [ev], idempotency_key)

    def update_feature_pass(
        self,
        session_id: str,
        feature_id: str,
        passes: bool,
        *,
        idempotency_key: str | None = None,
    ) -> AppendResult:
        """Set one feature's `passes`; FeatureNotFoundError (nothing written) if unknown."""
        if not isinstance(feature_id, str):
            raise InvalidRecordError(f"feature_id must be a str, got {type(feature_id).__name__}")
        if not isinstance(passes, bool):
            raise InvalidRecordError(f"passes must be a bool, got {type(passes).__name__}")
        ev = FeaturePassUpdated(feature_id=feature_id, passes=passes)

        def build(head: Head, states: list[Any]) -> list[Event]:
            if not self.bootstrap.has_feature(states[0], feature_id):
                raise FeatureNotFoundError(session_id, feature_id)
            return [ev]

        result = self._write(session_id, build, idempotency_key, (self.bootstrap,), [ev])
        assert result is not None  # build never returns []
        return result

    def record_run_checkpoint(
        self, session_id: str, checkpoint: RunCheckpoint, *, idempotency_key: str | None = None
    ) -> AppendResult:
        """Append a run checkpoint."""
        return self._write_records(
            session_id,
            lambda c: CheckpointRecorded(checkpoint=c),
            checkpoint if type(checkpoint) is RunCheckpoint else None,
            lambda: validated_copy(checkpoint, RunCheckpoint, "checkpoint"),
            idempotency_key,
        )

    def load_transcript_messages(
        self,
        session_id: str,
        *,
        start: int | None = None,
        limit: int | None = None,
        last: int | None = None,
        idempotency_key: str | None = None,
    ) -> list[Message]:
        """Transcript messages in append order; `[]` for an unknown session.

        A page: `last=N`, the newest N; `start=i` (0-based) and/or `limit=N`,
        `messages[i:i + N]`. A page costs O(N), also from a cold store for `last` (see
        eventstore.ops.paging).
        """
        if start is None and limit is None and last is None:
            return self._loaded(session_id, self.transcript, self.transcript.copy)
        from eventstore.ops.paging import transcript_page

        return transcript_page(self, session_id, start=start, limit=limit, last=last)

    def append_transcript_messages(
        self,
        session_id: str,
        messages: Sequence[Message],
        *,
        idempotency_key: str | None = None,
    ) -> AppendResult:
        """Append messages as one atomic event (all or none after a crash)."""
        return self._write_records(
            session_id,
            lambda ms: MessagesAppended(messages=ms),
            _exactly(messages, Message),
            lambda: _records(messages, Message, "messages"),
            idempotency_key,
        )

    # -- the lower-level API ----------------------------------------------------------

    def append(
        self,
        session_id: str,
        events: Sequence[Event],
        *,
        expected_seq: int | None = None,
        idempotency_key: str | None = None,
    ) -> AppendResult:
        """Append typed events as one atomic batch.

        `expected_seq`: append only if the session's last sequence number equals it (0:
        the session must be empty), else raise ConcurrencyError and write nothing.
        `idempotency_key`: if a batch with this key was appended before (among the
        session's newest 1,000 keys), return its result and write nothing; if that batch
        was a different request, raise IdempotencyConflictError.
        """
        if isinstance(events, Event) or not isinstance(events, Sequence):
            raise InvalidRecordError("events must be a sequence of Event instances")
        if not events:
            raise InvalidRecordError("append needs at least one event")
        for e in events:
            if type(e) is Snapshot or type(e) is ArchivePruned:
                # a snapshot anywhere but a log's first line is corruption, and a pruning
                # record names history as gone: compaction and prune_archive write them
                raise InvalidRecordError(
                    f"append cannot take a {event_tag(type(e))} event: compact and"
                    " prune_archive write those"
                )
        checked = [self.codec.check(e) for e in events]
        if expected_seq is not None and (
            not isinstance(expected_seq, int) or isinstance(expected_seq, bool) or expected_seq < 0
        ):
            raise InvalidRecordError(f"expected_seq must be an int >= 0, got {expected_seq!r}")

        def build(head: Head, states: list[Any]) -> list[Event]:
            if expected_seq is not None and head.seq != expected_seq:
                raise ConcurrencyError(session_id, expected_seq, head.seq)
            return checked

        result = self._write(session_id, build, idempotency_key, (), checked)
        assert result is not None
        return result

    def last_seq(self, session_id: str) -> int:
        """The session's last committed sequence number (0 if it has none)."""
        self._session(session_id)
        return self.engine.head(session_id).seq

    def load(self, session_id: str, projection: str | Projection[S]) -> Any:
        """The current state of any registered projection (by name or object), a copy."""
        proj = self._projection(projection)
        return self._loaded(session_id, proj, proj.copy)

    def list_sessions(self) -> list[str]:
        """The original ids of every session in the store, sorted."""
        self._check_open()
        return self.engine.list_sessions()

    def feed(self, after: Any = None, limit: int = 1000) -> list[tuple[Any, str, Event]]:
        """Up to `limit` events of every session after a feed position (None: the start),
        as (position, session id, event), for engines that keep a global feed (PostgreSQL:
        see `PostgresEngine.feed`); NotImplementedError for the others."""
        self._check_open()
        engine_feed = getattr(self.engine, "feed", None)
        if engine_feed is None:
            raise NotImplementedError(f"the engine of {self.engine.url} keeps no global feed")
        entries = engine_feed(after, limit) if after is not None else engine_feed(limit=limit)
        return [
            (
                e.position,
                e.session_id,
                self.codec.decode_line(e.line.rstrip(b"\n"), 0, e.session_id),
            )
            for e in entries
        ]

    def delete_session(self, session_id: str) -> bool:
        """Remove a session: its log, history and caches, atomically (no reader ever sees
        it half removed); safe beside live writers. False if it did not exist."""
        sess = self._session(session_id)
        with sess.lock:
            removed = self.engine.remove_session(session_id)
            sess.folds.clear()
            sess.head = None
            sess.prefix = None
        return removed

    # -- audit and replay, compaction (eventstore.ops.history, .verify, .follow, .compaction) --

    def read_events(
        self,
        session_id: str,
        *,
        from_seq: int = 1,
        to_seq: int | None = None,
        types: Iterable[str | type[Event]] | None = None,
    ) -> Iterator[Event]:
        """Typed events in sequence order (from the archive where compaction removed them);
        each has `.seq` and `.ts` (the aware time of its append)."""
        from eventstore.ops.history import read_events

        return read_events(self, session_id, from_seq=from_seq, to_seq=to_seq, types=types)

    def state_at(
        self, session_id: str, *, seq: int | None = None, at: datetime | str | None = None
    ) -> BootstrapState:
        """The bootstrap state as of sequence number `seq` or time `at` (one of them; an
        aware datetime or an ISO 8601 str, no offset meaning UTC)."""
        from eventstore.ops.history import state_at

        return state_at(self, session_id, seq=seq, at=at)

    def transcript_at(
        self, session_id: str, *, seq: int | None = None, at: datetime | str | None = None
    ) -> list[Message]:
        """The transcript as of sequence number `seq` or time `at` (one of them)."""
        from eventstore.ops.history import transcript_at

        return transcript_at(self, session_id, seq=seq, at=at)

    def verify(self, session_id: str) -> VerifyReport:
        """Check a session's log and archive: sequence, hash links, decoding, batches."""
        from eventstore.ops.verify import verify

        return verify(self, session_id)

    def follow(
        self,
        session_id: str,
        *,
        from_seq: int = 1,
        poll_interval: float = 0.2,
        stop: threading.Event | None = None,
    ) -> Iterator[Event]:
        """Yield events as they are appended (by any process, across compactions) until
        `stop` is set or the iterator is closed."""
        from eventstore.ops.follow import follow

        return follow(self, session_id, from_seq=from_seq, poll_interval=poll_interval, stop=stop)

    def compact(
        self,
        session_id: str,
        *,
        archive: bool = True,
        retention: Retention | None = None,
        force: bool = False,
    ) -> CompactionReport:
        """Rewrite the session's log as one snapshot, atomically (see eventstore.ops.compaction).

        `archive` keeps the old log in the session's history; `retention` trims the
        snapshot's lists (opt-in). Skipped, changing nothing, when the snapshot would not
        be smaller than the log, unless `force`. Safe beside live writers in any process.
        """
        from eventstore.ops import compaction

        return compaction.compact(
            self, session_id, archive=archive, retention=retention, force=force
        )

    # -- internals --------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"the store at {self.url} is closed")

    def _projection(self, projection: str | Projection[Any]) -> Projection[Any]:
        name = projection if isinstance(projection, str) else projection.name
        try:
            return self._projections[name]
        except KeyError:
            known = ", ".join(sorted(self._projections))
            raise UnknownProjectionError(
                f"no projection named {name!r} is registered (known: {known})"
            ) from None

    def _session(self, session_id: str) -> _Session:
        self._check_open()
        try:
            sess = self._sessions.get(session_id)
        except TypeError:  # unhashable, so not a str: validate_session_id says so
            sess = None
        if sess is None:
            validate_session_id(session_id)
            with self._guard:
                sess = self._sessions.get(session_id)
                if sess is None:
                    sess = self._sessions[session_id] = _Session(session_id)
                    excess = len(self._sessions) - self.cached_sessions
                    # the oldest opened go first; a thread still using one keeps it
                    dropped = [self._sessions.pop(k) for k in list(self._sessions)[:excess]]
                else:
                    dropped = []
            for old in dropped:
                self._save_caches(old)
                if old.kept_from_creation > 0:
                    self._kept_bytes -= old.kept_from_creation
        return sess

    def _loaded(self, session_id: str, proj: Projection[S], view: Callable[[S], T]) -> T:
        """`view(state)` of the caught-up state: what a load returns (the caller's own).

        Made under the session's lock: a writer folds its batch into the state in place,
        event by event, so a copy made after the lock is released could hold part of a
        batch. A cold load (the first of `proj` here) of a projection in `_pause_gc`
        folds the whole log with the cyclic collector paused (eventstore.core.gc_pause)."""
        sess = self._session(session_id)
        cold = proj.name not in sess.folds and proj.name in self._pause_gc
        with sess.lock, paused_gc if cold else _NO_PAUSE:
            return view(self._catch_up(sess, proj))

    def _has_fold(self, sess: _Session, name: str) -> bool:
        """Whether this store has folded projection `name` of the session before."""
        return name in sess.folds

    def _read_last_messages(self, sess: _Session, n: int) -> list[Message] | None:
        """The newest `n` messages read from the end of the live log, through the
        engine's ranged view of it (None: the engine has none, or the log cannot be
        sliced; fold instead)."""
        from eventstore.ops.paging import last_messages

        with self.engine.live_view(sess.session_id) as view:
            if view is None:
                return None
            return last_messages(
                view.read_span,
                view.head.size,
                n,
                self.codec,
                view.where,
                sess.checked_snapshots,
            )

    def _catch_up(self, sess: _Session, proj: Projection[S]) -> S:
        """Fold what was appended since the cached head (the log may have been replaced)."""
        f = sess.folds.get(proj.name)
        if f is None:
            f = sess.folds[proj.name] = self._first_fold(sess, proj)
        mark = None
        if self._marks and f.head.position is None:  # a fold from the start of the log
            p = sess.prefix
            mark = (
                p.mark()
                if p is not None and p.size
                else checked_prefix.load(self.engine, sess.session_id)
            )
        try:
            try:
                folded = self._fold_pieces(sess, proj, f, mark)
            except Exception as exc:
                if mark is None:
                    raise
                # fold again from the start, checking every line (which reports whatever
                # is wrong): nothing folded from bytes the mark did not prove is kept
                log.debug("eventstore: checked prefix of %r not used: %r", sess.session_id, exc)
                sess.prefix = None
                f.state, f.head = proj.initial(), EMPTY_HEAD
                folded = self._fold_pieces(sess, proj, f, None)
        except BaseException:
            # a piece may be half folded in place, or folded from bytes the mark did not
            # prove (an error, or an interrupt such as KeyboardInterrupt): the next load
            # folds from where this store's first fold starts, never on top of it
            sess.folds.pop(proj.name, None)
            raise
        if (
            folded >= _CACHE_AFTER_FOLD_BYTES
            and proj.name in self._cached
            and proj.name not in self._framed  # a load never pays for writing a large state
        ):
            self._save_fold(sess.session_id, proj.name, f.state, f.head)
            f.saved = f.head
        p = sess.prefix
        if p is not None and p.head is f.head and p.size - p.saved >= _CACHE_AFTER_FOLD_BYTES:
            checked_prefix.store(self.engine, sess.session_id, p)
        return f.state  # type: ignore[no-any-return]

    def _fold_pieces(
        self, sess: _Session, proj: Projection[S], f: _Fold, mark: checked_prefix.Mark | None
    ) -> int:
        """Fold the log after `f.head` into `f`, piece by piece (engines that can: a long
        log is never all in memory at once); returns how many bytes it folded.

        With `mark` (a fold from the start), the first `mark.size` bytes are folded
        without per-line hashes while they are hashed; a mismatch raises _PrefixMismatch
        (the caller discards the fold). The session's checked prefix grows with what
        this fold checks, when the fold starts where it ends (or at the start)."""
        codec = self.codec
        sid = sess.session_id
        grow = None
        if self._marks:
            p = sess.prefix
            if f.head.position is None:
                grow = checked_prefix.Prefix()
            elif p is not None and p.head.position == f.head.position:
                grow = p
        trusted = mark.size if mark is not None else 0  # the end of the bytes to prove
        folded = 0
        # hashes the checked prefix while this thread decodes; started before the first
        # read, so it is ready by the time the first piece is
        side = start_side_thread() if trusted >= _HASH_ASIDE else None
        piece: tuple[ReadResult, bool] | None = self.engine.read_some(
            sid, f.head.position, _READ_PIECE
        )
        try:
            while piece is not None:
                res, more = piece
                start = f.head
                if res.reset:
                    if trusted:
                        raise _PrefixMismatch("the log was replaced during the load")
                    f.state = proj.initial()
                    start = EMPTY_HEAD
                    folded = 0
                    grow = checked_prefix.Prefix() if self._marks else None
                data = res.data
                seq, link = start.seq, start.link
                split = min(len(data), max(0, trusted - res.offset))  # bytes of it to prove
                part = data if split == len(data) else data[:split]
                hashed = None
                if split:
                    assert mark is not None and grow is not None
                    end_head = res.head if split == len(data) else mark.head
                    if side is not None and split >= _HASH_ASIDE:
                        # a read follows: it hands the side thread the GIL
                        hashed = side.submit(grow.extend, part, end_head, wait=not more)
                    else:
                        grow.extend(part, end_head)
                # the next piece (from where this one ends) is read before this one is
                # decoded: the side thread starts hashing meanwhile
                piece = self.engine.read_some(sid, res.head.position, _READ_PIECE) if more else None
                if split:
                    assert mark is not None and grow is not None
                    lines = read_lines(
                        part, codec, codec.decoder(proj.event_types), res.where,
                        offset=res.offset, seq=seq, link=link, hashes_checked=True,
                    )  # fmt: skip
                    if lines.end != len(part):
                        raise _PrefixMismatch("the prefix does not end with a whole batch")
                    # folded while the side thread hashes (a snapshot's states decode
                    # then): nothing is kept unless the digest below proves the bytes
                    f.state = fold_events(self, sid, proj, f.state, lines.events, res.where)
                    if hashed is not None:
                        hashed.result()
                    folded += split
                    assert lines.seq is not None and lines.link is not None  # given seq, link
                    seq, link = lines.seq, lines.link
                    if res.offset + split == trusted:
                        proven = grow.mark().digest == mark.digest
                        if not proven or (seq, lines.h) != (mark.head.seq, mark.head.h):
                            raise _PrefixMismatch("the digest or the last line differs")
                        trusted = 0  # proven: the rest is checked line by line
                        grow.saved = mark.saved  # (what the engine keeps needs no rewrite)
                if split < len(data):
                    rest = data if not split else data[split:]
                    lines = read_lines(
                        rest,
                        codec,
                        codec.decoder(proj.event_types),
                        res.where,
                        offset=res.offset + split,
                        seq=seq,
                        link=link,
                    )
                    f.state = fold_events(self, sid, proj, f.state, lines.events, res.where)
                    folded += len(rest)
                    if grow is not None:
                        grow.extend(rest, res.head)
                f.head = res.head  # the state and its head advance together, piece by piece
                sess.head = res.head
        finally:
            if side is not None:
                side.close()
        if trusted:
            raise _PrefixMismatch("the log ends before the prefix does")
        if (
            grow is not None
            and grow.size
            and (sess.prefix is None or grow.size >= sess.prefix.size)
        ):
            sess.prefix = grow
        return folded

    def _write_records(
        self,
        session_id: str,
        event: Callable[[Any], Event],
        given: object | None,
        validate: Callable[[], Any],
        idempotency_key: str | None,
    ) -> AppendResult:
        """Append `event(records)`: the caller's records as `given` (None when they are
        not exactly of the declared types) or their validated copies from `validate`.

        The hot path (records given, no key): the event holds the caller's records,
        which are validated and copied by one round trip as the event is encoded. If
        that refuses them (nothing written), `validate` runs below and raises the error
        that names the field; if it finds nothing wrong, the records changed while they
        were encoded (another thread), and their validated copy, one consistent picture,
        is appended, as the keyed path would. With a key, records are validated first,
        so a request is judged by its valid form."""
        if given is not None and idempotency_key is None:
            try:
                return self._write_events(session_id, [event(given)], None, check=True)
            except NotAsStoredError:
                pass
        return self._write_events(session_id, [event(validate())], idempotency_key)

    def _write_events(
        self,
        session_id: str,
        events: list[Event],
        idempotency_key: str | None,
        *,
        check: bool = False,
    ) -> AppendResult:
        """Append `events`, which need no validation against the session's state.

        `check`: the events hold the caller's records, unvalidated: encoding checks them
        (NotAsStoredError, nothing written; see `_write_records`)."""
        result = self._write(
            session_id, lambda h, s: events, idempotency_key, (), events, check=check
        )
        assert result is not None
        return result

    def _first_fold(self, sess: _Session, proj: Projection[S]) -> _Fold:
        """Where this process starts folding a projection: the engine's fold cache when
        it keeps one that checks, else the beginning."""
        if proj.name in self._cached:
            found = fold_cache.load(self.engine, sess.session_id, proj, self._cached[proj.name])
            if found is not None:
                return _Fold(found[0], found[1], found[1])
        return _Fold(proj.initial(), EMPTY_HEAD)

    def _save_fold_caches(self, session_id: str, head: Head, states: dict[str, Any]) -> None:
        """Keep folded `states` (by projection name, at `head`) in the fold cache, for
        the projections it keeps (compaction's states of the snapshot it installed)."""
        for name, state in states.items():
            if name in self._cached:
                self._save_fold(session_id, name, state, head)

    def _save_fold(self, session_id: str, name: str, state: Any, head: Head) -> None:
        """Keep projection `name`'s `state` at `head` in the fold cache, marked with the
        event types this store decodes of those it reads."""
        proj = self._projections[name]
        fold_cache.store(self.engine, session_id, proj, state, head, self._cached[name])

    def _write(
        self,
        session_id: str,
        build: Build,
        idempotency_key: str | None,
        needs: tuple[Projection[Any], ...] = (),
        request: list[Event] | None = None,
        *,
        check: bool = False,
    ) -> AppendResult | None:
        """The one write path: fold what `build` needs, build (validate), append against
        the head those folds reached; on a moved head, catch up and do it again.

        `request`: the events the caller asked for, whose fingerprint a reused
        idempotency key must match (IdempotencyConflictError otherwise)."""
        if idempotency_key is not None:
            if not isinstance(idempotency_key, str) or not idempotency_key:
                raise InvalidRecordError("idempotency_key must be a non-empty str")
            if not idempotency_key.isascii():
                try:
                    idempotency_key.encode("utf-8")
                except UnicodeEncodeError:
                    raise InvalidRecordError(
                        f"idempotency_key {idempotency_key!r} is not encodable as UTF-8"
                        " (lone surrogate)"
                    ) from None
        sess = self._session(session_id)
        wanted = (self.idempotency, *needs) if idempotency_key is not None else needs
        with sess.lock:
            head = sess.head
            fresh = False  # whether `head` was read from the engine during this call
            while True:
                states: list[Any] = []
                if wanted:
                    folds = sess.folds
                    if not fresh and head is not None and _all_at(folds, wanted, head):
                        # the states this store left at its own head: no read. The append
                        # is conditional on that head, so a stale one costs a retry only
                        states = [folds[p.name].state for p in wanted]
                    else:
                        head, states = self._fold_to_one_head(sess, wanted)
                        fresh = True
                    if idempotency_key is not None:
                        seen = states.pop(0).get(idempotency_key)
                        if seen is not None:
                            if not fresh:
                                fresh = True  # a replay answers from the log as it is now
                                continue
                            if request is not None:
                                self._check_replay(session_id, idempotency_key, seen, request)
                            return AppendResult(seen[0], seen[1], replayed=True)
                elif head is None:
                    head = sess.head = self.engine.head(session_id)
                    fresh = True
                try:
                    events = build(head, states)
                except EventStoreError:
                    if fresh:
                        raise
                    fresh = True  # judged against a cached head or state: read them, judge again
                    if not wanted:
                        head = self.engine.head(session_id)
                    continue
                if not events:
                    return None
                data, stamped, link = self.codec.encode_batch(
                    events, head.seq + 1, head.link, datetime.now(UTC), idempotency_key, check=check
                )
                batch = EncodedBatch(
                    data,
                    stamped[0].seq,
                    stamped[-1].seq,
                    tuple(map(_get_h, stamped)),
                    link,
                    idempotency_key,
                    self._fingerprint(events) if idempotency_key is not None else None,
                )
                try:
                    new = self.engine.append(session_id, batch, head)
                except HeadMovedError as exc:
                    if exc.actual.same_chain_point(head):
                        raise  # an engine refusing the head it reports: retrying cannot help
                    head = sess.head = exc.actual
                    fresh = True
                    continue
                break
            if head.seq == 0 and head.position is None and self._marks:
                self._keep_from_creation(sess, head)
            elif sess.kept_from_creation >= 0:
                self._count_kept(sess, len(data))
            for name, f in sess.folds.items():
                fh = f.head  # (identity first: a fold this store left at its own head)
                if fh is head or (fh.seq == head.seq and fh.position == head.position):
                    proj = self._projections[name]
                    try:
                        # a user's apply may change the event it gets (the built-in
                        # states share its records): it folds the batch decoded from
                        # the bytes written, as a cold load would give it to it
                        own = stamped if name in self._builtin else _decoded(self, proj, data)
                        f.state = fold(proj, f.state, own)
                    except BaseException as exc:
                        # folded in place, part of the batch may be in it: start over (the
                        # next load folds the log again). The batch is committed: raising
                        # an Exception now would make the caller write it again
                        f.state, f.head = proj.initial(), EMPTY_HEAD
                        if not isinstance(exc, Exception):
                            raise
                        log.warning("eventstore: folding %r into %r failed: %r",
                                    session_id, name, exc)  # fmt: skip
                        continue
                    f.head = new
            sess.head = new
            result = _new_result(stamped[0].seq, stamped[-1].seq, False)
        if self.auto_compact is not None:
            try:
                self._maybe_compact(session_id, new)
            except (EventStoreError, OSError) as exc:
                # the append is committed: failing it now would make callers retry and
                # duplicate it; the next due append tries compacting again
                log.warning("eventstore: automatic compaction of %r failed: %s", session_id, exc)
        return result

    def _vouch_for_snapshot(self, sess: _Session, line: bytes, head: Head) -> None:
        """The checked prefix of a log a compaction just made of one snapshot `line`
        (bytes this store encoded and chained itself), kept for cold loads: the first
        load after it need not check a long line's hash."""
        if not self._marks or head.size != len(line):
            return
        p = checked_prefix.Prefix()
        p.extend(line, head)
        with sess.lock:
            if sess.prefix is not None or sess.head is not head:
                return  # a load or an append got there first
            sess.prefix = p
        checked_prefix.store(self.engine, sess.session_id, p)

    def _fold_to_one_head(
        self, sess: _Session, projections: tuple[Projection[Any], ...]
    ) -> tuple[Head, list[Any]]:
        """Catch every projection up to the same head (re-reading if an append landed
        between two of the reads)."""
        while True:
            states = [self._catch_up(sess, p) for p in projections]
            heads = {
                (sess.folds[p.name].head.seq, sess.folds[p.name].head.link) for p in projections
            }
            if len(heads) == 1:
                return sess.folds[projections[-1].name].head, states

    def _fingerprint(self, events: Sequence[Event]) -> str:
        """A digest of what a keyed request asked to write: its events' types and payloads,
        without the envelope (sequence, time of append, key, hash) and with every time
        inside a record masked, so a retry that rebuilt its records (fresh default
        times) is the same request, while a time set where there was none is not."""
        digest = hashlib.blake2b(digest_size=16)
        for ev in events:
            if type(ev) is UnknownEvent:
                data = msgspec.json.decode(ev.raw)
            else:
                data = _request_form(ev)
                data["type"] = event_tag(type(ev))
            payload = {k: v for k, v in data.items() if k not in _ENVELOPE}
            digest.update(msgspec.json.encode(payload, order="sorted") + b"\n")
        return digest.hexdigest()

    def _check_replay(
        self, session_id: str, key: str, seen: tuple[int, int], request: list[Event]
    ) -> None:
        """IdempotencyConflictError unless the batch `key` was first given to (`seen`,
        its first and last seq) is the same request as `request`. A batch compacted
        away without an archive cannot be compared, and replays."""
        first, last = seen
        try:
            stored = list(self.read_events(session_id, from_seq=first, to_seq=last))
        except HistoryUnavailableError:
            return
        if len(stored) != last - first + 1 or any(type(e) is Snapshot for e in stored):
            return
        if self._fingerprint(stored) != self._fingerprint(request):
            raise IdempotencyConflictError(session_id, key, first, last)

    def _maybe_compact(self, session_id: str, head: Head) -> None:
        auto = self.auto_compact
        assert auto is not None
        sess = self._session(session_id)
        base, floor = sess.auto_floor
        # head.seq == base_seq: a lone snapshot, nothing left to compact; a log skipped as
        # not shrinking is tried again once it has doubled (or was replaced): O(1) a byte
        if (
            head.seq != head.base_seq
            and (head.size >= floor or head.base_seq != base)
            and auto.due(head.size, head.seq - head.base_seq + 1)
        ):
            report = self.compact(session_id, archive=auto.archive, retention=auto.retention)
            skipped = report.skipped == "would_not_shrink"
            sess.auto_floor = (report.first_seq, 2 * report.bytes_before) if skipped else (0, 0)


def _decoded(store: SessionStore, proj: Projection[Any], data: bytes) -> list[Event]:
    """The events of a batch this store encoded (`data`, current versions), decoded
    afresh for `proj`: the types it does not read as bare envelopes."""
    return store.codec.decoder(proj.event_types).decode_lines(data)


def _all_at(folds: dict[str, _Fold], projections: tuple[Projection[Any], ...], head: Head) -> bool:
    """Whether every projection has a fold at exactly `head` (the same object)."""
    for p in projections:
        f = folds.get(p.name)
        if f is None or f.head is not head:
            return False
    return True


# the envelope of a line: where and when it was appended, not what was asked for
_ENVELOPE = frozenset({"seq", "ts", "more", "key", "v", "h"})


def _request_form(value: Any) -> Any:
    """`value` as plain data for a fingerprint: Structs as dicts of every field, times
    masked, raw JSON decoded, enums as their values."""
    if isinstance(value, datetime):
        return "<time>"
    if isinstance(value, msgspec.Raw):
        return _request_form(msgspec.json.decode(value))
    if isinstance(value, msgspec.Struct):
        return {f: _request_form(getattr(value, f)) for f in value.__struct_fields__}
    if isinstance(value, dict):
        return {str(k): _request_form(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_request_form(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.value
    return value


def _manifest_of(session_id: str, manifest: object) -> SessionManifest:
    """A validated copy of a manifest that names this session."""
    validate_session_id(session_id)  # a bad id is reported as such, before the manifest
    m = validated_copy(manifest, SessionManifest, "manifest")
    if m.session_id != session_id:
        raise InvalidRecordError(f"the manifest names session {m.session_id!r}, not {session_id!r}")
    return m


def _features(values: object, what: str) -> list[FeatureRecord]:
    """A validated copy of a feature list whose ids are unique."""
    features = _records(values, FeatureRecord, what)
    seen: set[str] = set()
    for i, f in enumerate(features):
        if f.id in seen:
            raise InvalidRecordError(f"{what}[{i}]: feature id {f.id!r} appears twice")
        seen.add(f.id)
    return features


# the hot path's constructors (see eventstore.core.frozen)
_new_result = maker(AppendResult)
_get_h = attrgetter("h")


def _has_manifest(state: BootstrapState) -> bool:
    return state.manifest is not None


def _exactly(values: object, cls: type[T]) -> list[T] | None:
    """`values` as a new list when it is a list or tuple of exactly `cls` instances (no
    subclass), else None: the records the hot path validates as it encodes them."""
    if type(values) is not list and type(values) is not tuple:
        return None
    for v in values:
        if type(v) is not cls:
            return None
    return list(values)


def _records(values: object, cls: type[T], what: str) -> list[T]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise InvalidRecordError(f"{what} must be a list of {cls.__name__}")
    return [validated_copy(v, cls, f"{what}[{i}]") for i, v in enumerate(values)]
