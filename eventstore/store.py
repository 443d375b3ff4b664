"""`SessionStore`: the session API over per-session event logs (the face).

Each session's projections are cached with the cursor they were folded to, so a repeated
load folds only what was appended since, by this process or another. Writes go through
one path (`_write`): take the session's writers' lock, catch up, validate, append one
batch, fold the new events into the caches that were current.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from projections import (
    BootstrapProjection,
    IdempotencyProjection,
    Projection,
    TranscriptProjection,
    fold,
)

from .compaction import CompactionReport, Retention, compact, fold_events
from .errors import (
    ConcurrencyError,
    EventStoreError,
    FeatureNotFoundError,
    InvalidRecordError,
    StorageError,
    StoreClosedError,
    UnsafePathError,
)
from .events import (
    CheckpointRecorded,
    Event,
    EventCodec,
    FeatureListReplaced,
    FeaturePassUpdated,
    ManifestSet,
    MessagesAppended,
    ProgressAppended,
    Upcaster,
    validated_copy,
)
from .layout import SessionPaths, list_session_ids, validate_session_id
from .log import EMPTY, Cursor, Durability, FileSessionLog, LogWriter
from .records import (
    BootstrapState,
    FeatureRecord,
    Message,
    ProgressEntry,
    RunCheckpoint,
    SessionManifest,
)

if TYPE_CHECKING:
    from .audit import VerifyReport

__all__ = ["AppendResult", "AutoCompact", "SessionStore"]

log = logging.getLogger("eventstore")
S = TypeVar("S")
T = TypeVar("T")

BOOTSTRAP = BootstrapProjection()
TRANSCRIPT = TranscriptProjection()
IDEMPOTENCY = IdempotencyProjection()


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
    __slots__ = ("cursor", "state")

    def __init__(self, state: Any, cursor: Cursor) -> None:
        self.state = state
        self.cursor = cursor


class _Session:
    """What the store keeps per session: its log and its folded projections."""

    __slots__ = ("file_start", "folds", "lock", "log", "paths")

    def __init__(self, paths: SessionPaths, log: FileSessionLog) -> None:
        self.paths = paths
        self.log = log
        self.lock = threading.RLock()
        self.folds: dict[str, _Fold] = {}
        self.file_start: tuple[tuple[int, int], int] = ((0, 0), 0)  # (file ident, first seq)


class SessionStore:
    """Durable per-session memory for agent harnesses, kept as append-only event logs.

    `root` is a directory, created (mode 0700) if missing. `durability` is "flush"
    (every append reaches the OS before it returns: survives a killed process) or
    "fsync" (every append is fsynced: survives power loss). `event_types`,
    `projections` and `upcasters` extend the store with custom events, custom folds
    and readers of old event versions. `auto_compact` (off by default) compacts a
    session after an append once its log passes a size or event-count threshold.
    Usable as a context manager; safe to share between threads; any number of
    processes may open the same root.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        durability: Durability = "flush",
        *,
        event_types: Iterable[type[Event]] = (),
        projections: Iterable[Projection[Any]] = (),
        upcasters: Iterable[tuple[type[Event], int, Upcaster]] = (),
        auto_compact: AutoCompact | None = None,
    ) -> None:
        if durability not in ("flush", "fsync"):
            raise ValueError(f"durability must be 'flush' or 'fsync', not {durability!r}")
        self.root = Path(root)
        self.durability: Durability = durability
        _ensure_root(self.root)
        self.codec = EventCodec(event_types)
        for cls, version, fn in upcasters:
            self.codec.register_upcaster(cls, version, fn)
        self._projections: dict[str, Projection[Any]] = {}
        builtin: list[Projection[Any]] = [BOOTSTRAP, TRANSCRIPT, IDEMPOTENCY]
        for p in (*builtin, *projections):
            if p.name in self._projections:
                raise ValueError(f"two projections are named {p.name!r}")
            self._projections[p.name] = p
        self.auto_compact = auto_compact
        self._sessions: dict[str, _Session] = {}
        self._guard = threading.Lock()
        self._closed = False

    # -- lifecycle --------------------------------------------------------------------

    def close(self) -> None:
        """Forget cached state. Nothing needs flushing: every append is already written."""
        with self._guard:
            self._sessions.clear()
            self._closed = True

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
        return self._state(session_id, BOOTSTRAP).manifest is not None

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
            ManifestSet(manifest=validated_copy(manifest, SessionManifest, "manifest")),
            FeatureListReplaced(features=_records(feature_list, FeatureRecord, "feature_list")),
        ]
        if initial_progress_entry is not None:
            entry = validated_copy(initial_progress_entry, ProgressEntry, "initial_progress_entry")
            events.append(ProgressAppended(entry=entry))
        if initial_checkpoint is not None:
            cp = validated_copy(initial_checkpoint, RunCheckpoint, "initial_checkpoint")
            events.append(CheckpointRecorded(checkpoint=cp))

        def build(sess: _Session, w: LogWriter) -> list[Event]:
            if self._catch_up(sess, BOOTSTRAP).manifest is not None:
                return []
            return events

        # a replayed key means an earlier call with this key initialized the session
        return self._write(session_id, build, idempotency_key) is not None

    def load_bootstrap_state(
        self, session_id: str, *, idempotency_key: str | None = None
    ) -> BootstrapState:
        """The manifest, features, progress and checkpoints; `BootstrapState()` if unknown."""
        return BOOTSTRAP.copy(self._state(session_id, BOOTSTRAP))

    def save_manifest(
        self, session_id: str, manifest: SessionManifest, *, idempotency_key: str | None = None
    ) -> None:
        """Replace the session's manifest."""
        ev = ManifestSet(manifest=validated_copy(manifest, SessionManifest, "manifest"))
        self._write(session_id, lambda s, w: [ev], idempotency_key)

    def append_progress_entry(
        self, session_id: str, entry: ProgressEntry, *, idempotency_key: str | None = None
    ) -> None:
        """Append a progress note."""
        ev = ProgressAppended(entry=validated_copy(entry, ProgressEntry, "entry"))
        self._write(session_id, lambda s, w: [ev], idempotency_key)

    def replace_feature_list(
        self,
        session_id: str,
        features: Sequence[FeatureRecord],
        *,
        idempotency_key: str | None = None,
    ) -> None:
        """Replace the whole feature list; order is kept."""
        ev = FeatureListReplaced(features=_records(features, FeatureRecord, "features"))
        self._write(session_id, lambda s, w: [ev], idempotency_key)

    def update_feature_pass(
        self,
        session_id: str,
        feature_id: str,
        passes: bool,
        *,
        idempotency_key: str | None = None,
    ) -> None:
        """Set one feature's `passes`; FeatureNotFoundError (nothing written) if unknown."""
        if not isinstance(feature_id, str):
            raise InvalidRecordError(f"feature_id must be a str, got {type(feature_id).__name__}")
        if not isinstance(passes, bool):
            raise InvalidRecordError(f"passes must be a bool, got {type(passes).__name__}")
        ev = FeaturePassUpdated(feature_id=feature_id, passes=passes)

        def build(sess: _Session, w: LogWriter) -> list[Event]:
            state = self._catch_up(sess, BOOTSTRAP)
            if not any(f.id == feature_id for f in state.feature_list):
                raise FeatureNotFoundError(session_id, feature_id)
            return [ev]

        self._write(session_id, build, idempotency_key)

    def record_run_checkpoint(
        self, session_id: str, checkpoint: RunCheckpoint, *, idempotency_key: str | None = None
    ) -> None:
        """Append a run checkpoint."""
        ev = CheckpointRecorded(checkpoint=validated_copy(checkpoint, RunCheckpoint, "checkpoint"))
        self._write(session_id, lambda s, w: [ev], idempotency_key)

    def load_transcript_messages(
        self, session_id: str, *, idempotency_key: str | None = None
    ) -> list[Message]:
        """Every transcript message in append order; `[]` for an unknown session."""
        return TRANSCRIPT.copy(self._state(session_id, TRANSCRIPT))

    def append_transcript_messages(
        self,
        session_id: str,
        messages: Sequence[Message],
        *,
        idempotency_key: str | None = None,
    ) -> None:
        """Append messages as one atomic event (all or none after a crash)."""
        ev = MessagesAppended(messages=_records(messages, Message, "messages"))
        self._write(session_id, lambda s, w: [ev], idempotency_key)

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
        session's newest 1,000 keys), return its result and write nothing.
        """
        if isinstance(events, Event) or not isinstance(events, Sequence):
            raise InvalidRecordError("events must be a sequence of Event instances")
        if not events:
            raise InvalidRecordError("append needs at least one event")
        checked = [self.codec.check(e) for e in events]
        if expected_seq is not None and (
            not isinstance(expected_seq, int) or isinstance(expected_seq, bool) or expected_seq < 0
        ):
            raise InvalidRecordError(f"expected_seq must be an int >= 0, got {expected_seq!r}")

        def build(sess: _Session, w: LogWriter) -> list[Event]:
            if expected_seq is not None and w.head.seq != expected_seq:
                raise ConcurrencyError(session_id, expected_seq, w.head.seq)
            return checked

        result = self._write(session_id, build, idempotency_key)
        assert result is not None
        return result

    def last_seq(self, session_id: str) -> int:
        """The session's last committed sequence number (0 if it has none)."""
        return self._session(session_id).log.last_seq()

    def load(self, session_id: str, projection: str | Projection[S]) -> Any:
        """The current state of any registered projection (by name or object), a copy."""
        proj = self._projection(projection)
        return proj.copy(self._state(session_id, proj))

    def list_sessions(self) -> list[str]:
        """The original ids of every session in the store, sorted."""
        self._check_open()
        return list_session_ids(self.root)

    # -- audit and replay (eventstore.audit) and compaction (eventstore.compaction) ----

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
        from .audit import read_events

        return read_events(self, session_id, from_seq=from_seq, to_seq=to_seq, types=types)

    def state_at(
        self, session_id: str, *, seq: int | None = None, at: datetime | None = None
    ) -> BootstrapState:
        """The bootstrap state as of sequence number `seq` or time `at` (one of them)."""
        from .audit import state_at

        return state_at(self, session_id, seq=seq, at=at)

    def transcript_at(
        self, session_id: str, *, seq: int | None = None, at: datetime | None = None
    ) -> list[Message]:
        """The transcript as of sequence number `seq` or time `at` (one of them)."""
        from .audit import transcript_at

        return transcript_at(self, session_id, seq=seq, at=at)

    def verify(self, session_id: str) -> VerifyReport:
        """Check a session's log and archive: sequence, hash links, decoding, batches."""
        from .audit import verify

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
        from .audit import follow

        return follow(self, session_id, from_seq=from_seq, poll_interval=poll_interval, stop=stop)

    def compact(
        self,
        session_id: str,
        *,
        archive: bool = True,
        retention: Retention | None = None,
    ) -> CompactionReport:
        """Rewrite the session's log as one snapshot, atomically (see eventstore.compaction).

        `archive` keeps the old log in the session's archive folder; `retention` trims
        the snapshot's lists (opt-in). Safe beside live writers in any process.
        """
        return compact(self, session_id, archive=archive, retention=retention)

    # -- internals --------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"the store at {self.root} is closed")

    def _projection(self, projection: str | Projection[Any]) -> Projection[Any]:
        name = projection if isinstance(projection, str) else projection.name
        try:
            return self._projections[name]
        except KeyError:
            raise KeyError(f"no projection named {name!r} is registered") from None

    def _session(self, session_id: str) -> _Session:
        self._check_open()
        try:
            sess = self._sessions.get(session_id)
        except TypeError:  # unhashable, so not a str: validate_session_id says so
            sess = None
        if sess is None:
            validate_session_id(session_id)
            paths = SessionPaths(self.root, session_id)
            sess = _Session(paths, FileSessionLog(paths, self.codec, self.durability))
            with self._guard:
                sess = self._sessions.setdefault(session_id, sess)
        return sess

    def _state(self, session_id: str, proj: Projection[S]) -> S:
        sess = self._session(session_id)
        with sess.lock:
            return self._catch_up(sess, proj)

    def _catch_up(self, sess: _Session, proj: Projection[S]) -> S:
        """Fold what was appended since the cached cursor (the file may have been replaced)."""
        f = sess.folds.get(proj.name)
        if f is None:
            f = sess.folds[proj.name] = _Fold(proj.initial(), EMPTY)
        res = sess.log.read(f.cursor, self.codec.decoder(proj.event_types), proj.name)
        if res.reset:
            f.state = proj.initial()
        if res.events:
            f.state = fold_events(self, sess, proj, f.state, res.events)
        f.cursor = res.cursor
        return f.state  # type: ignore[no-any-return]

    def _write(
        self,
        session_id: str,
        build: Callable[[_Session, LogWriter], list[Event]],
        idempotency_key: str | None,
    ) -> AppendResult | None:
        """The one write path: lock, catch up, check the key, build (validate), append."""
        if idempotency_key is not None and (
            not isinstance(idempotency_key, str) or not idempotency_key
        ):
            raise InvalidRecordError("idempotency_key must be a non-empty str")
        if idempotency_key is not None and not idempotency_key.isascii():
            try:
                idempotency_key.encode("utf-8")
            except UnicodeEncodeError:
                raise InvalidRecordError(
                    f"idempotency_key {idempotency_key!r} is not encodable as UTF-8"
                    " (lone surrogate)"
                ) from None
        sess = self._session(session_id)
        with sess.lock:
            with sess.log.writer() as w:
                if idempotency_key is not None:
                    keys = self._catch_up(sess, IDEMPOTENCY)
                    seen = keys.get(idempotency_key)
                    if seen is not None:
                        return AppendResult(seen[0], seen[1], replayed=True)
                events = build(sess, w)
                if not events:
                    return None
                before = w.head
                stamped = w.append(events, idempotency_key)
                for name, f in sess.folds.items():
                    if f.cursor == before:
                        f.state = fold(self._projections[name], f.state, stamped)
                        f.cursor = w.head
                head = w.head
            result = AppendResult(stamped[0].seq, stamped[-1].seq)
            if self.auto_compact is not None:
                try:
                    self._maybe_compact(sess, head)
                except (EventStoreError, OSError) as exc:
                    # the append is committed: failing it now would make callers retry
                    # and duplicate it; the next due append tries compacting again
                    log.warning(
                        "eventstore: automatic compaction of %r failed: %s", session_id, exc
                    )
            return result

    def _maybe_compact(self, sess: _Session, head: Cursor) -> None:
        auto = self.auto_compact
        assert auto is not None
        ident, first = sess.file_start
        if ident != head.ident:
            first = sess.log.first_seq(head.ident)
            sess.file_start = (head.ident, first)
        # head.seq == first: a lone snapshot, nothing left to compact
        if head.seq != first and auto.due(head.offset, head.seq - first + 1):
            compact(self, sess.paths.session_id, archive=auto.archive, retention=auto.retention)


def _ensure_root(root: Path) -> None:
    try:
        st = os.stat(root)
    except NotADirectoryError as exc:
        raise UnsafePathError(f"store root {root}: a part of the path is not a directory") from exc
    except FileNotFoundError:
        missing = [root, *(p for p in root.parents if not p.exists())]
        for path in reversed(missing):  # every directory we create is private, not just the last
            try:
                os.mkdir(path, 0o700)
            except FileExistsError:
                pass
            except OSError as exc:
                raise StorageError(
                    f"cannot create the store root {root}: {exc}", exc.errno
                ) from exc
        return
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePathError(f"store root {root} exists and is not a directory")


def _records(values: object, cls: type[T], what: str) -> list[T]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise InvalidRecordError(f"{what} must be a list of {cls.__name__}")
    return [validated_copy(v, cls, f"{what}[{i}]") for i, v in enumerate(values)]
