"""`SessionStore`: the session API, the domain face over the session core.

The ten operations of the session contract, and the lower-level API (typed appends,
projections by name, history, verify, follow, compaction), each a thin layer over the
session core (`eventstore.core.session_core`: per-session state, the fold loop, the write
loop) and the operations written once for every engine (`eventstore.ops`). What this
module adds: validating the caller's records, the domain's checks (a manifest names its
session, feature ids are unique and known), a replayed idempotency key naming the same
request, and automatic compaction after an append.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from eventstore.core import validation
from eventstore.core.fingerprint import fingerprint
from eventstore.core.keys import rekey
from eventstore.core.session_core import (
    DEFAULT_CACHED_SESSIONS,
    AppendResult,
    Build,
    SessionCacheInfo,
    SessionCore,
    check_options,
)
from eventstore.core.tuning import Tuning
from eventstore.engines.base import Durability, Engine, FeedEngine, Head, open_engine
from eventstore.errors import (
    ConcurrencyError,
    EventStoreError,
    FeatureNotFoundError,
    HistoryUnavailableError,
    IdempotencyConflictError,
    InvalidArgumentError,
    InvalidRecordError,
    UnsupportedError,
)
from eventstore.format.codec import (
    EventCodec,
    NotAsStoredError,
    validated_copy,
)
from eventstore.format.crypt import KeyRing
from eventstore.format.events import (
    ArchivePruned,
    CheckpointRecorded,
    Event,
    FeatureListReplaced,
    FeaturePassUpdated,
    KeyForgotten,
    LabelsSet,
    ManifestSet,
    MessagesAppended,
    ProgressAppended,
    Quarantined,
    Sealed,
    SessionDeleted,
    Snapshot,
    Upcaster,
    event_tag,
)
from eventstore.logger import log
from eventstore.ops import history, lifecycle, listing, paging, tombstone
from eventstore.ops import retention as retention_ops
from eventstore.ops.listing import SessionInfo
from eventstore.records import (
    BootstrapState,
    FeatureRecord,
    Message,
    ProgressEntry,
    RunCheckpoint,
    SessionManifest,
)
from eventstore.session_ids import validate_session_id
from projections import Projection, Retention

if TYPE_CHECKING:
    # the audit tools load when first used: the session API's hot use never needs them
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

    from eventstore.ops.compaction import CompactionReport
    from eventstore.ops.fork import ForkResult
    from eventstore.ops.seal import Sealer, SealFacts, SealPolicy

    PublicKeyLike = Ed25519PublicKey | Ed25519PrivateKey | str | os.PathLike[str]
    from eventstore.ops.verify import VerifyReport

__all__ = [
    "AppendResult",
    "AutoCompact",
    "SessionCacheInfo",
    "SessionInfo",
    "SessionStore",
    "Tuning",
]

S = TypeVar("S")


class AutoCompact(msgspec.Struct, frozen=True):
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


class SessionStore:
    """Durable per-session memory for agent harnesses, kept as append-only event logs.

    `root` is a store URL or path (see `eventstore.engines`): a directory (created 0700
    if missing) or `file:///abs/dir` for the file engine, `memory://` or `memory://NAME`
    for memory, `postgresql://...` for PostgreSQL; or an `Engine` instance. `durability`
    is "flush" (every append reaches the OS before it returns: survives a killed
    process) or "fsync" (every append is flushed to the disk before it returns: survives
    power loss). `event_types`, `projections` and `upcasters` extend the store with
    custom events, custom folds and readers of old event versions. `auto_compact` (off
    by default) compacts a session after an append once its log passes a size or
    event-count threshold; `retention` (a `Policy`) compacts one whose live log holds
    more than its `keep_events` and prunes archived history older than its
    `archive_older_than` after each such compaction (`gc` applies it to every session).
    `cached_sessions`: how many sessions' folded states the store
    keeps in memory; past it, the oldest opened are dropped (their caches saved first)
    and refold on next use. `caches`: whether the engine's fold caches and checked
    prefixes are used (`eventstore.core.cache_policy`); `tuning`: the sizes the store
    reads, hashes and caches by (`Tuning`). Usable as a context manager; safe to share
    between threads; any number of processes may open the same file or database store.

    The bootstrap projection's state, and that of any projection with a true
    `cache_folds` attribute (the transcript's is one), is kept between processes in the
    engine's fold cache (the file engine keeps it beside the log): a cold load folds only
    what was appended after it. A cold load of the built-in projections, and of any with
    a true `pause_gc` attribute (whose folds make no cyclic garbage), runs with the
    cyclic garbage collector paused (`eventstore.core.gc_pause`).

    `signing_key` (an Ed25519 private key, or the path of an unencrypted PEM file; the
    `crypto` extra) seals sessions as `seal_policy` says (`SealPolicy`: at close, every
    N lines or T seconds, after compaction, to a witness file), and keys the caches'
    MAC; `cache_key` (32 bytes or more) keys that MAC instead, for a store that does not
    sign (`eventstore.ops.seal`, `eventstore.core.fold_cache`).
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
        cached_sessions: int = DEFAULT_CACHED_SESSIONS,
        caches: bool = True,
        tuning: Tuning | None = None,
        signing_key: Ed25519PrivateKey | str | os.PathLike[str] | None = None,
        seal_policy: SealPolicy | None = None,
        cache_key: bytes | None = None,
        keys: KeyRing | None = None,
        retention: retention_ops.Policy | None = None,
    ) -> None:
        if not isinstance(root, (str, os.PathLike, Engine)):
            raise InvalidArgumentError(
                f"root must be a path, a store URL or an Engine, not {validation.described(root)}"
            )
        if durability not in ("flush", "fsync"):
            raise InvalidArgumentError(f"durability must be 'flush' or 'fsync', not {durability!r}")
        if auto_compact is not None and not isinstance(auto_compact, AutoCompact):
            raise InvalidArgumentError(f"auto_compact must be an AutoCompact, got {auto_compact!r}")
        if retention is not None and not isinstance(retention, retention_ops.Policy):
            raise InvalidArgumentError(
                f"retention must be a Policy, got {validation.described(retention)}"
            )
        if keys is not None and not isinstance(keys, KeyRing):
            raise InvalidArgumentError(f"keys must be a KeyRing, got {validation.described(keys)}")
        self.durability: Durability = durability
        # what the arguments can refuse is checked before the engine opens (a file store
        # would create its directory): the codec, then the core below
        check_options(cached_sessions, caches, tuning)
        self.sealer: Sealer | None = _sealer(signing_key, seal_policy)
        mac_key = cache_key if cache_key is not None else signing_key
        cache_mac = None
        if mac_key is not None:
            from eventstore.signing import cache_mac as derive_mac

            cache_mac = derive_mac(mac_key)
        self.codec = EventCodec(validation.listed(event_types, "event_types"))
        for cls, version, fn in validation.upcasters_of(upcasters):
            self.codec.register_upcaster(cls, version, fn)
        projections = validation.projections_of(projections)
        self.engine: Engine = (
            root if isinstance(root, Engine) else open_engine(root, durability=durability)
        )
        self.url = self.engine.url
        engine_root = getattr(self.engine, "root", None)
        # the directory of a file store (None for other engines)
        self.root: Path | None = engine_root if isinstance(engine_root, Path) else None
        self.auto_compact = auto_compact
        self.retention = retention
        """The retention `Policy` applied at automatic compaction and by `gc` (None: none)."""
        self.cached_sessions = cached_sessions
        try:
            self.core = SessionCore(
                self.engine,
                self.codec,
                projections,
                cached_sessions=cached_sessions,
                caches=caches,
                tuning=tuning,
                cache_mac=cache_mac,
                keys=keys,
            )
            if retention is not None:  # refused before anything is written
                retention_ops.check_engine(self.core, retention)
        except BaseException:
            if not isinstance(root, Engine):
                self.engine.close()  # (the store never opened: release what it opened)
            raise
        """The session core under this store: what the operations in `eventstore.ops`
        take (history, verify, compaction, repair, export, lifecycle, migrate)."""
        self.bootstrap = self.core.bootstrap
        self.transcript = self.core.transcript

    # -- lifecycle --------------------------------------------------------------------

    def close(self) -> None:
        """Seal the sessions this store wrote to since their last seal (a store opened
        with a signing key whose policy seals on close), save the fold caches worth
        saving, forget cached state and release the engine. Every append is already
        written: the caches only save later loads time."""
        if self.sealer is not None and not self.core.closed:
            try:
                self.sealer.close(self.core)
            finally:
                self.sealer.release()
        self.core.close()

    def __enter__(self) -> SessionStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def projections(self) -> dict[str, Projection[Any]]:
        """The projections this store folds, by name (built-in and user-defined)."""
        return dict(self.core.projections)

    def learn(
        self, event_types: Iterable[type[Event]] = (), projections: Iterable[Projection[Any]] = ()
    ) -> bool:
        """Decode `event_types` and fold `projections` too, from now on, as if they had
        been given to the constructor; True if anything was new. Every adapter in
        `eventstore.integrations` calls it with its own when it is given a store, so one
        plainly opened store serves them all. Known ones are skipped; a type whose tag,
        or a projection whose name, this store holds for another class is a typed error
        (nothing learned). New event types make the store fold again what it keeps in
        memory: learn once per adapter, not per call."""
        return self.core.learn(event_types, projections)

    # -- the session API --------------------------------------------------------------

    def is_initialized(self, session_id: str, *, idempotency_key: str | None = None) -> bool:
        """True once the session has a manifest. (`idempotency_key` is accepted so every
        session operation has the same shape; reads are idempotent anyway.)"""
        _read_key(idempotency_key)
        return self.core.loaded(session_id, self.bootstrap, _has_manifest)

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
            ManifestSet(manifest=validation.manifest_of(session_id, manifest)),
            FeatureListReplaced(features=validation.feature_list(feature_list, "feature_list")),
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
        _read_key(idempotency_key)
        return self.core.loaded(session_id, self.bootstrap, self.bootstrap.copy)

    def save_manifest(
        self, session_id: str, manifest: SessionManifest, *, idempotency_key: str | None = None
    ) -> AppendResult:
        """Replace the session's manifest (whose `session_id` must be this session's)."""
        ev = ManifestSet(manifest=validation.manifest_of(session_id, manifest))
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
        ev = FeatureListReplaced(features=validation.feature_list(features, "features"))
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
        _read_key(idempotency_key)
        if start is None and limit is None and last is None:
            return self.core.loaded(session_id, self.transcript, self.transcript.copy)
        return paging.transcript_page(self.core, session_id, start=start, limit=limit, last=last)

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
            validation.exactly(messages, Message),
            lambda: validation.records(messages, Message, "messages"),
            idempotency_key,
        )

    # -- the lower-level API ----------------------------------------------------------

    def append(
        self,
        session_id: str,
        events: Sequence[Event],
        *,
        expected_seq: int | None = None,
        expected_h: str | None = None,
        idempotency_key: str | None = None,
    ) -> AppendResult:
        """Append typed events as one atomic batch.

        `expected_seq`: append only if the session's last sequence number equals it (0:
        the session must be empty), else raise ConcurrencyError and write nothing.
        `expected_h` (with `expected_seq`): the `h` of that last line as the caller read
        it (the newest event's `h`; "" for an empty session): the append is refused too
        when the session holds as many lines but another last one (deleted and written
        again, repaired, replaced from a backup), for a decision taken from the log's
        own lines.
        `idempotency_key`: if a batch with this key was appended before (among the
        session's newest 1,000 keys), return its result and write nothing; if that batch
        was a different request, raise IdempotencyConflictError.
        """
        checked = _appendable(self.codec, events)
        if expected_seq is not None and (
            not isinstance(expected_seq, int) or isinstance(expected_seq, bool) or expected_seq < 0
        ):
            raise InvalidRecordError(f"expected_seq must be an int >= 0, got {expected_seq!r}")
        if expected_h is not None and (expected_seq is None or not isinstance(expected_h, str)):
            raise InvalidRecordError(
                f"expected_h must be a str given with expected_seq, got {expected_h!r}"
            )

        def build(head: Head, states: list[Any]) -> list[Event]:
            if expected_seq is not None and head.seq != expected_seq:
                raise ConcurrencyError(session_id, expected_seq, head.seq)
            if expected_h is not None and head.h != expected_h:
                raise ConcurrencyError(session_id, head.seq, head.seq, other_line=True)
            return checked

        result = self._write(session_id, build, idempotency_key, (), checked)
        assert result is not None
        return result

    def append_decided(
        self,
        session_id: str,
        projection: str | Projection[Any],
        decide: Callable[[Any], Sequence[Event]],
    ) -> AppendResult | None:
        """Append what `decide(state)` returns for the projection's current state, as
        one atomic batch committed only at the head that state was folded to; None (and
        nothing written) if it returns no events.

        One engine round trip when this store's state of the projection is at the
        session's head (this store's last write or load of it folded it there), since
        the append itself checks the head: a state another writer made stale costs a
        retry, never a wrong decision. So `decide` may run more than once: again with the
        state read from the engine after the head moved, or after it raised an
        `EventStoreError` for a state judged without that read (a refusal is never
        answered from a stale state: the error of the fresh state is the answer). No
        events, though, is an answer from the state as held, as `initialize_session_if_missing`
        answers: a decision that must see the newest state to write nothing raises an
        error of its own instead. `decide` gets the store's own state: it must not
        change it.
        """
        proj = self.core.projection(projection)
        if not callable(decide):
            raise InvalidArgumentError(
                f"decide must be callable, not {validation.described(decide)}"
            )

        def build(head: Head, states: list[Any]) -> list[Event]:
            events = decide(states[0])
            if isinstance(events, Sequence) and not isinstance(events, Event) and not events:
                return []
            return _appendable(self.codec, events)

        return self._write(session_id, build, None, (proj,), [])

    def last_seq(self, session_id: str) -> int:
        """The session's last committed sequence number (0 if it has none)."""
        self.core.session(session_id)
        return self.engine.head(session_id).seq

    def load(self, session_id: str, projection: str | Projection[S]) -> Any:
        """The current state of any registered projection (by name or object), a copy."""
        proj = self.core.projection(projection)
        return self.core.loaded(session_id, proj, proj.copy)

    def list_sessions(self, prefix: str | None = None) -> list[str]:
        """The original ids of every session in the store (those starting with
        `prefix`), sorted; deleted sessions (their tombstones) are not listed: see
        `deleted_sessions`. Read from the logs themselves, never from the session index
        (for pages of `SessionInfo` in an order, see `sessions`)."""
        self.core.check_open()
        if prefix is not None and not isinstance(prefix, str):
            raise InvalidArgumentError(f"prefix must be a str, not {validation.described(prefix)}")
        ids = tombstone.live_sessions(self.core)
        return ids if prefix is None else [sid for sid in ids if sid.startswith(prefix)]

    def sessions(
        self,
        prefix: str | None = None,
        *,
        after: SessionInfo | str | None = None,
        limit: int | None = None,
        order: str = "updated",
        labels: Mapping[str, str] | None = None,
        updated_since: datetime | str | None = None,
    ) -> list[SessionInfo]:
        """A page of the store's sessions as `SessionInfo`, from the engine's session
        index (a page costs about its length, not a read of every session).

        `order`: "updated" (the default) or "created", newest first, or "id".
        `after`: the last `SessionInfo` of the previous page (or its `cursor`): the page
        starts just past it. `limit`: at most this many (None: all). Filters: `prefix`
        of the id, `labels` the session carries (each key with that value),
        `updated_since` (an aware datetime or ISO 8601 str). What a walk through the
        pages guarantees under concurrent writes: see `eventstore.ops.listing`. An
        engine that keeps no index answers the same by reading every session.
        """
        return listing.sessions(
            self.core,
            prefix,
            after=after,
            limit=limit,
            order=order,
            labels=labels,
            updated_since=updated_since,
        )

    def set_labels(
        self, session_id: str, labels: Mapping[str, str], *, idempotency_key: str | None = None
    ) -> AppendResult:
        """Give the session these labels (the whole set: one absent here is removed),
        as one `labels_set` event; `sessions` lists and filters by them. Labels are
        non-empty str keys with str values (InvalidArgumentError otherwise, nothing
        written)."""
        ev = LabelsSet(labels=listing.check_labels(labels, "labels"))
        return self._write_events(session_id, [ev], idempotency_key)

    def rebuild_index(self) -> int:
        """Rebuild the engine's session index from the logs, reading every session once
        (after a crash the file engine could not heal, or a store written by a release
        without the index); the number of sessions indexed. Safe beside live writers."""
        return listing.rebuild_index(self.core)

    def feed(self, after: Any = None, limit: int = 1000) -> list[tuple[Any, str, Event]]:
        """Up to `limit` events of every session after a feed position (None: the start),
        as (position, session id, event), for engines that keep a global feed (PostgreSQL:
        see `PostgresEngine.feed`); UnsupportedError (a NotImplementedError) for the
        others."""
        self.core.check_open()
        validation.whole(limit, "limit")
        if not isinstance(self.engine, FeedEngine):
            raise UnsupportedError(f"the engine of {self.engine.url} keeps no global feed")
        entries = self.engine.feed(after, limit)
        return [
            (
                e.position,
                e.session_id,
                self.codec.decode_line(e.line.rstrip(b"\n"), 0, e.session_id),
            )
            for e in entries
        ]

    def delete_session(
        self, session_id: str, *, purge: bool = False, by: str | None = None
    ) -> bool:
        """Delete a session: its events, history and caches go, and a tombstone stays
        (when, `by` whom (default: this process's user and pid), its last seq and hash),
        so any later write to the id raises SessionDeletedError until `restore`; reads
        give the empty state. `purge`: remove every trace instead (the id is free again).
        Safe beside live writers in any process: an append racing it lands before it
        (and is deleted) or is refused. False if it did not exist or was deleted already
        (see `eventstore.ops.tombstone`)."""
        return lifecycle.delete_session(self.core, session_id, purge=purge, by=by)

    def restore(self, session_id: str) -> bool:
        """Free a deleted session's id: the tombstone is removed and the next write
        starts a fresh session. False (nothing changed) if it is not deleted."""
        return tombstone.restore(self.core, session_id)

    def tombstone_of(self, session_id: str) -> tombstone.Tombstone | None:
        """The session's tombstone, or None when it is not deleted."""
        return tombstone.tombstone_of(self.core, session_id)

    def deleted_sessions(self) -> list[tombstone.Tombstone]:
        """The tombstone of every deleted session, by id (`eventstore sessions
        --deleted`)."""
        return tombstone.deleted_sessions(self.core)

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
        return history.read_events(
            self.core, session_id, from_seq=from_seq, to_seq=to_seq, types=types
        )

    def state_at(
        self, session_id: str, *, seq: int | None = None, at: datetime | str | None = None
    ) -> BootstrapState:
        """The bootstrap state as of sequence number `seq` or time `at` (one of them; an
        aware datetime or an ISO 8601 str, no offset meaning UTC)."""
        return history.state_at(self.core, session_id, seq=seq, at=at)

    def transcript_at(
        self, session_id: str, *, seq: int | None = None, at: datetime | str | None = None
    ) -> list[Message]:
        """The transcript as of sequence number `seq` or time `at` (one of them)."""
        return history.transcript_at(self.core, session_id, seq=seq, at=at)

    def verify(
        self,
        session_id: str,
        *,
        public_key: PublicKeyLike | None = None,
        witness: str | os.PathLike[str] | None = None,
    ) -> VerifyReport:
        """Check a session's log and archive: sequence, hash links, decoding, batches.

        `public_key` (an Ed25519 public or private key, or a PEM file's path): check
        every seal's signature, that the history holds each sealed head, and the sealing
        policy (a session with no seal, too many events after a seal). `witness` (a
        witness file's path, or a witness store's URL): check the seals it holds against
        the history too. What is found is reported, never raised (see
        `eventstore.ops.seal`)."""
        from eventstore.ops import seal, verify

        key = None
        if public_key is not None:
            from eventstore.signing import load_public_key

            key = load_public_key(public_key)
        held = None if witness is None else seal.load_witness(witness, session_id)
        return verify.verify(self.core, session_id, public_key=key, witness=held)

    def seal(self, session_id: str) -> SealFacts | None:
        """Seal the session's head now with the store's signing key (and write the seal
        to the policy's witness); None when it has no event or its last line is already
        a seal. SigningKeyError if the store was opened without a signing key."""
        if self.sealer is None:
            from eventstore.errors import SigningKeyError

            raise SigningKeyError(
                f"the store at {self.url} has no signing key: open it with signing_key="
            )
        validate_session_id(session_id)
        return self.sealer.seal(self.core, session_id)

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
        from eventstore.ops import follow

        return follow.follow(
            self.core, session_id, from_seq=from_seq, poll_interval=poll_interval, stop=stop
        )

    def compact(
        self,
        session_id: str,
        *,
        archive: bool = True,
        retention: Retention | None = None,
        force: bool = False,
        dry_run: bool = False,
    ) -> CompactionReport:
        """Rewrite the session's log as one snapshot, atomically (see eventstore.ops.compaction).

        `archive` keeps the old log in the session's history; `retention` trims the
        snapshot's lists (opt-in). Skipped, changing nothing, when the snapshot would not
        be smaller than the log, unless `force`. Safe beside live writers in any process.
        `dry_run`: report what it would do, and write nothing.
        """
        from eventstore.ops import compaction

        report = compaction.compact(
            self.core,
            session_id,
            archive=archive,
            retention=retention,
            force=force,
            dry_run=dry_run,
        )
        if self.sealer is not None and report.compacted and not dry_run:
            self.sealer.seal_quietly(self.core, session_id)  # seal the snapshot installed
        return report

    def forget_key(self, session_id: str) -> bool:
        """Crypto-shredding: destroy the session's data key (its key slot in this store's
        engine, and this store's copy in memory), then append a `key_forgotten` record.
        Afterwards nothing of the session can be read (KeyForgottenError naming the
        session and data key id) or written, and `verify` still proves its chain. False
        (and nothing changes) for a session that has no data key. Needs `keys=`."""
        keys = self.core.keys
        if keys is None:
            raise InvalidArgumentError("forget_key needs a store opened with keys=KeyRing(...)")
        self.core.session(session_id)  # validates the id, checks the store is open
        dk = keys.forget(session_id)
        if dk is None:
            return False
        self.core.forget(session_id)  # drop the folded states this store kept in memory
        record: list[Event] = [KeyForgotten(dk=dk)]
        self._write(session_id, lambda head, states: record, None, (), record)
        return True

    def rekey(self, new: KeyRing) -> tuple[int, int]:
        """Rewrap every data key this store's key ring unwraps with `new`'s current master
        key, dropping the old wraps; no log is rewritten (see docs/encryption.md).
        Returns (rewrapped, left: forgotten keys and keys of master keys this ring lacks).
        Afterwards open the store with `new`. Needs `keys=`."""
        if self.core.keys is None:
            raise InvalidArgumentError("rekey needs a store opened with keys=KeyRing(...)")
        if not isinstance(new, KeyRing):
            raise InvalidArgumentError(f"new must be a KeyRing, got {validation.described(new)}")
        self.core.check_open()
        return rekey(self.engine, self.core.keys.ring, new)

    def fork_session(self, source: str, session_id: str, at_seq: int | None = None) -> ForkResult:
        """Start `session_id` from `source`'s state after `at_seq` (what `state_at(source,
        seq=at_seq)` gives; its head when None): its first event is a snapshot naming the
        source, seq and line hash, which `verify` checks (see eventstore.ops.fork).
        SessionExistsError if `session_id` holds anything; nothing is written on error."""
        from eventstore.ops import fork

        return fork.fork_session(self.core, source, session_id, at_seq)

    def first_kept_seq(self, session_id: str) -> int:
        """The first sequence number the session's history still holds: 1, or after
        `prune_archive` the one after the last event it pruned."""
        return history.first_kept_seq(self.core, session_id)

    def prune_archive(self, session_id: str, before: int | datetime) -> lifecycle.PruneReport:
        """Remove, for good, the archived segments wholly before seq (or time) `before`,
        recording what was removed (see `eventstore.ops.lifecycle.prune_archive`)."""
        return lifecycle.prune_archive(self.core, session_id, before)

    def delete_older_than(
        self,
        age: timedelta,
        *,
        now: datetime | None = None,
        dry_run: bool = False,
        purge: bool = False,
    ) -> list[lifecycle.ExpiryResult]:
        """Delete every session idle for longer than `age`, each leaving a tombstone
        unless `purge` (see `eventstore.ops.lifecycle.delete_older_than`)."""
        return lifecycle.delete_older_than(self.core, age, now=now, dry_run=dry_run, purge=purge)

    def gc(
        self,
        policy: retention_ops.Policy | None = None,
        *,
        dry_run: bool = False,
        now: datetime | None = None,
    ) -> retention_ops.GcReport:
        """Apply a retention `Policy` (this store's `retention` when None) to every
        session: idle ones tombstoned, long live logs compacted, old archives pruned;
        safe beside live writers; `dry_run` changes nothing (see
        `eventstore.ops.retention.gc`). InvalidArgumentError when there is no policy."""
        policy = self.retention if policy is None else policy
        if policy is None:
            raise InvalidArgumentError("gc needs a policy: give one, or SessionStore(retention=)")
        return retention_ops.gc(self.core, policy, dry_run=dry_run, now=now)

    # -- what the store keeps in memory ----------------------------------------------

    def cache_info(self, session_id: str) -> SessionCacheInfo:
        """What this store keeps in memory for a session: its folded projections with the
        seq each is folded to and the seq its fold cache holds (as far as this store
        knows), and the bytes of the live log it can vouch for. For tests and tuning."""
        return self.core.cache_info(session_id)

    def forget_cached_state(self, session_id: str | None = None) -> None:
        """Drop what this store keeps in memory for a session (every session: None), as if
        it had never been loaded here; the next use folds from the engine's caches and
        log. Nothing stored changes."""
        if session_id is not None:
            validate_session_id(session_id)
        self.core.forget(session_id)

    # -- internals --------------------------------------------------------------------

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
        """Append `events`, which need no validation against the session's state (the
        hot path: one call into the core, then `_after_write` only when it has work)."""
        if self.sealer is not None:
            sealed = self._write_sealed(
                session_id, lambda h, s: events, idempotency_key, (), events, check
            )
            assert sealed is not None
            return sealed
        result = self.core.write(session_id, lambda h, s: events, idempotency_key, check=check)
        assert result is not None
        if result.replayed or self.auto_compact is not None or self.retention is not None:
            self._after_write(session_id, idempotency_key, result, events)
        return result

    def _write(
        self,
        session_id: str,
        build: Build,
        idempotency_key: str | None,
        needs: tuple[Projection[Any], ...],
        request: list[Event],
    ) -> AppendResult | None:
        """Append what `build` returns, judged against the states in `needs`."""
        if self.sealer is not None:
            return self._write_sealed(session_id, build, idempotency_key, needs, request, False)
        result = self.core.write(session_id, build, idempotency_key, needs)
        if result is not None:
            self._after_write(session_id, idempotency_key, result, request)
        return result

    def _write_sealed(
        self,
        session_id: str,
        build: Build,
        idempotency_key: str | None,
        needs: tuple[Projection[Any], ...],
        request: list[Event],
        check: bool,
    ) -> AppendResult | None:
        """`_write` for a sealing store: the write and the seal its policy makes due hold
        the session's lock together, so no other thread's append comes between them
        (another process's still can: `eventstore.ops.seal`)."""
        with self.core.session(session_id).lock:
            result = self.core.write(
                session_id, build, idempotency_key, needs, check=check, share_flush=False
            )
            if result is not None:
                self._after_write(session_id, idempotency_key, result, request)
        return result

    def _after_write(
        self, session_id: str, key: str | None, result: AppendResult, request: list[Event]
    ) -> None:
        """What the domain adds to the core's write: a replayed key must name the same
        request, a due session is compacted and a due seal written (separate trips)."""
        if result.replayed:
            if key is not None:
                _check_replay(self.core, session_id, key, result, request)
            return
        if self.auto_compact is not None or self.retention is not None:
            try:
                self._maybe_compact(session_id)
            except (EventStoreError, OSError) as exc:
                # the append is committed: failing it now would make callers retry and
                # duplicate it; the next due append tries compacting again
                log.warning("eventstore: automatic compaction of %r failed: %s", session_id, exc)
        if self.sealer is not None:
            self.sealer.after_write(self.core, session_id, result.last_seq, result.first_seq)

    def _maybe_compact(self, session_id: str) -> None:
        auto = self.auto_compact
        policy = self.retention
        sess = self.core.session(session_id)
        head = sess.head
        if head is None:
            return
        base, floor = sess.auto_floor
        lines = head.seq - head.base_seq + 1
        # head.seq == base_seq: a lone snapshot, nothing left to compact; a log skipped as
        # not shrinking is tried again once it has doubled (or was replaced): O(1) a byte
        if (
            head.seq != head.base_seq
            and (head.size >= floor or head.base_seq != base)
            and (
                (auto is not None and auto.due(head.size, lines))
                or (policy is not None and retention_ops.over(policy, lines))
            )
        ):
            report = self.compact(
                session_id,
                archive=True if auto is None else auto.archive,
                retention=None if auto is None else auto.retention,
            )
            skipped = report.skipped == "would_not_shrink"
            sess.auto_floor = (report.first_seq, 2 * report.bytes_before) if skipped else (0, 0)
            if policy is not None and report.compacted:
                retention_ops.prune_old_archive(self.core, session_id, policy)


def _appendable(codec: EventCodec, events: object) -> list[Event]:
    """`events` checked for an append (InvalidRecordError, nothing written, if not)."""
    if isinstance(events, Event) or not isinstance(events, Sequence):
        raise InvalidRecordError("events must be a sequence of Event instances")
    if not events:
        raise InvalidRecordError("append needs at least one event")
    for e in events:
        if type(e) in (
            Snapshot,
            ArchivePruned,
            Quarantined,
            Sealed,
            SessionDeleted,
            KeyForgotten,
        ):
            # a snapshot anywhere but a log's first line is corruption, a pruning or
            # quarantine record names history as gone, a seal is signed by the
            # store's key, a tombstone ends the session, and a key_forgotten record
            # follows a destroyed key: compaction, prune_archive, repair, seal,
            # delete_session and forget_key write them
            raise InvalidRecordError(
                f"append cannot take a {event_tag(type(e))} event: compact,"
                " prune_archive, repair, seal, delete_session and forget_key write those"
            )
    return [codec.check(e) for e in events]


def _check_replay(
    core: SessionCore, session_id: str, key: str, seen: AppendResult, request: list[Event]
) -> None:
    """IdempotencyConflictError unless the batch `key` was first given to (`seen`) is the
    same request as `request`. A batch compacted away without an archive cannot be
    compared, and replays."""
    first, last = seen.first_seq, seen.last_seq
    try:
        stored = list(history.read_events(core, session_id, from_seq=first, to_seq=last))
    except HistoryUnavailableError:
        return
    if len(stored) != last - first + 1 or any(type(e) is Snapshot for e in stored):
        return
    if fingerprint(stored) != fingerprint(request):
        raise IdempotencyConflictError(session_id, key, first, last)


def _sealer(signing_key: object, policy: SealPolicy | None) -> Sealer | None:
    """The sealer of a store opened with `signing_key` (None without one)."""
    if signing_key is None:
        if policy is not None:
            from eventstore.errors import SigningKeyError

            raise SigningKeyError("a seal_policy needs a signing_key to seal with")
        return None
    from eventstore.ops.seal import Sealer, SealPolicy, witness_writer
    from eventstore.signing import load_signing_key

    if policy is not None and not isinstance(policy, SealPolicy):
        raise InvalidArgumentError(f"seal_policy must be a SealPolicy, not {policy!r}")
    policy = policy or SealPolicy()
    return Sealer(load_signing_key(signing_key), policy, witness_writer(policy.witness))


def _has_manifest(state: BootstrapState) -> bool:
    return state.manifest is not None


def _read_key(key: object) -> None:
    """A read takes an idempotency key only for the shape of the API; a bad one is
    still refused, as a write refuses it."""
    if key is not None:
        validation.check_key(key)
