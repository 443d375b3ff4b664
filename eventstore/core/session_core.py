"""`SessionCore`: per-session state over an engine, the fold loop and the write loop.

Each session's projections are kept folded with the engine position they were folded to,
so a repeated load folds only what was appended since, by this process or another. Every
line a fold reads is checked against the hash chain (`eventstore.format.reader`). Writes
go through one path (`write`): fold what the command must be validated against, build
the events, encode them chained to the head that fold reached, and ask the engine to
append them against that head; if another writer moved the head meanwhile, catch up and
try again (the engine writes nothing on a moved head). The states that were current are
advanced by the appended events without reading them back.

The public API (`eventstore.store.SessionStore`) is the domain face over one core; the
operations (`eventstore.ops`) take the core. Nothing here knows an operation.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import nullcontext
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import msgspec

from eventstore import entropy, process
from eventstore.core import tuning as tunings
from eventstore.core.cache_policy import CachePolicy
from eventstore.core.fingerprint import fingerprint
from eventstore.core.fold_loop import FoldContext, fold_log
from eventstore.core.gc_pause import paused_gc
from eventstore.core.keys import CacheCipher, SessionKeys
from eventstore.core.last_line import (
    fold_of_last_line,
    head_line,
    last_line_fold,
    last_line_only,
)
from eventstore.core.sessions import Fold, SessionState, SessionTable
from eventstore.core.tuning import Tuning
from eventstore.core.validation import check_key, projections_of
from eventstore.engines.base import (
    EMPTY_HEAD,
    EncodedBatch,
    Engine,
    Head,
    HeadMovedError,
    KeyEngine,
    SeqLine,
    WriterTurn,
)
from eventstore.errors import (
    EncryptedSessionError,
    EventStoreError,
    InvalidArgumentError,
    SessionDeletedError,
    StorageError,
    StoreClosedError,
    UnknownProjectionError,
)
from eventstore.format.codec import EventCodec
from eventstore.format.crypt import DataKey, KeyRing, key_id_of
from eventstore.format.events import (
    ArchivePruned,
    Event,
    KeyForgotten,
    LabelsSet,
    Quarantined,
    Sealed,
    SessionDeleted,
    Snapshot,
    micros,
)
from eventstore.logger import log
from eventstore.session_ids import validate_session_id

if TYPE_CHECKING:
    from eventstore.signing import CacheMac

from projections import (
    BootstrapProjection,
    IdempotencyProjection,
    LabelsProjection,
    LifecycleProjection,
    Projection,
    TranscriptProjection,
    fold,
)

__all__ = [
    "AppendResult",
    "Build",
    "CoreOwner",
    "HasCore",
    "SessionCacheInfo",
    "SessionCore",
    "check_options",
    "core_of",
]

S = TypeVar("S")
T = TypeVar("T")

# a build function: given the head and the folded states asked for, the events to append
Build = Callable[[Head, list[Any]], list[Event]]

# Sessions whose folded states a store keeps by default: a process going through 10,000
# sessions grows about as much as on sqlite3 (~6 kB a kept session); one let go is
# loaded again from its fold caches (bench/results/2026-12-05-session-cache-default-256.md).
DEFAULT_CACHED_SESSIONS = 256
_NO_PAUSE = nullcontext()  # a warm load folds only a tail: the collector stays on


class AppendResult(msgspec.Struct, frozen=True):
    """What an append wrote: its first and last sequence numbers. `replayed` is True when
    the idempotency key had been seen and nothing was written this time."""

    first_seq: int
    last_seq: int
    replayed: bool = False


class SessionCacheInfo(msgspec.Struct, frozen=True):
    """What a store keeps in memory for one session (`SessionStore.cache_info`).

    `folds`: each folded projection's name -> (the seq it is folded to, the seq the
    engine's fold cache holds as far as this store knows, None if unknown). `prefix`:
    bytes of the live log this store can vouch for with one digest (None: none).
    `checked_snapshots`: snapshot lines a cold transcript page checked whole."""

    folds: dict[str, tuple[int, int | None]]
    prefix: int | None
    checked_snapshots: int


class SessionCore:
    """Per-session state, folds and writes over one engine (see the module docstring).

    `projections`: the user's, beside the three built-in ones (bootstrap, transcript,
    idempotency). `cached_sessions`: how many sessions' states are kept in memory; past
    it the oldest opened are dropped (their caches saved first). `caches`: whether the
    engine's fold caches and checked prefixes are used (when it keeps any). `cache_mac`:
    the keyed MAC those caches carry and must carry to be used (None: unkeyed)."""

    def __init__(
        self,
        engine: Engine,
        codec: EventCodec,
        projections: Iterable[Projection[Any]] = (),
        *,
        cached_sessions: int = DEFAULT_CACHED_SESSIONS,
        caches: bool = True,
        tuning: Tuning | None = None,
        cache_mac: CacheMac | None = None,
        keys: KeyRing | None = None,
    ) -> None:
        check_options(cached_sessions, caches, tuning)
        self.engine = engine
        self.codec = codec
        # a store with keys seals every payload it writes, and its fold caches (a fold
        # cache is the folded state); a checked prefix holds only hashes and sizes
        self.keys = None if keys is None else SessionKeys(engine, keys)
        self._plain: set[str] = set()  # sessions found to have no data key (see cipher_for)
        if self.keys is not None:
            codec.opener = self.keys.opener
        self.url = engine.url
        self.tuning = tuning or tunings.DEFAULT_TUNING
        self.bootstrap = BootstrapProjection()
        self.transcript = TranscriptProjection()
        self.idempotency = IdempotencyProjection()
        # every write folds it: a write after a tombstone is refused (SessionDeletedError)
        self.lifecycle = LifecycleProjection()
        self._just_lifecycle: tuple[Projection[Any], ...] = (self.lifecycle,)
        self.labels = LabelsProjection()
        builtin: list[Projection[Any]] = [
            self.bootstrap, self.transcript, self.idempotency, self.lifecycle, self.labels
        ]  # fmt: skip
        self.projections: dict[str, Projection[Any]] = {}
        for p in (*builtin, *projections_of(projections)):
            if p.name in self.projections:
                raise InvalidArgumentError(f"two projections are named {p.name!r}")
            self.projections[p.name] = p
        # the built-in projections never change an event they are given: they share an
        # append's events (with those that say so: `sharing`); every other fold gets
        # events of its own
        self.builtin = frozenset(p.name for p in builtin)
        self.sharing = self._sharing()
        self.reading = self._reading()
        self.pause_gc = self._pausing()
        self.caches = CachePolicy(
            engine, codec, self.projections, self.builtin, self.tuning, caches, cache_mac,
            None if self.keys is None else CacheCipher(self.keys),
        )  # fmt: skip
        self.sessions = SessionTable(cached_sessions, self._dropped)
        self._fold_context = FoldContext(engine, codec, self.tuning, self.caches)
        self.closed = False
        self._closing = threading.Lock()
        self._learning = threading.Lock()
        process.track(self)

    def _sharing(self) -> frozenset[str]:
        # the projections a writer folds the events it appended (not a decode of their
        # bytes): the built-in ones, and those whose authors say `apply` never changes an
        # event (`changes_events = False`)
        return frozenset(
            name
            for name, p in self.projections.items()
            if name in self.builtin or getattr(p, "changes_events", True) is False
        )

    def _reading(self) -> _Reading:
        # the event classes each projection saying `ignores_other_types` reads, with the
        # snapshot and the tombstone every fold takes: a writer does not fold it a batch
        # of none of them (its state would come back unchanged)
        types = self.codec.types
        return _Reading(
            {
                name: frozenset({Snapshot, SessionDeleted, *(types[t] for t in tags if t in types)})
                for name, p in self.projections.items()
                if (tags := p.event_types) is not None
                and getattr(p, "ignores_other_types", False) is True
            }
        )

    def _pausing(self) -> frozenset[str]:
        # the projections whose cold folds run with the cyclic collector paused: the
        # built-in ones, and those whose authors say their folds make no cyclic garbage
        return frozenset(
            name
            for name, p in self.projections.items()
            if name in self.builtin or getattr(p, "pause_gc", False) is True
        )

    def learn(
        self, event_types: Iterable[type[Event]], projections: Iterable[Projection[Any]]
    ) -> bool:
        """Know `event_types` and fold `projections` too, from now on (what an adapter
        given this store needs); whether anything was new. Known ones are skipped (a
        projection is known when one of its name and class is registered); a projection
        whose name another class holds, or a type whose tag another type holds, is a
        typed error, and then nothing is learned. New event types make the store forget
        what it keeps in memory (a fold of every type read them as unknown), so the next
        use folds again: learn once, when the adapter is made, not per call."""
        self.check_open()
        new_projections: dict[str, Projection[Any]] = {}
        for p in projections_of(projections):
            name = p.name
            known = self.projections.get(name)
            if known is None:
                known = new_projections.get(name)
            if known is None:
                new_projections[name] = p
            elif type(known) is not type(p):
                raise InvalidArgumentError(
                    f"cannot learn projection {name!r}: the store folds another"
                    f" projection of that name ({type(known).__name__})"
                )
        with self._learning:
            new_tags = self.codec.learn(event_types)  # checks every type before any change
            if not new_tags and not new_projections:
                return False
            self.projections.update(new_projections)
            self.sharing = self._sharing()
            self.reading = self._reading()
            self.pause_gc = self._pausing()
            self.caches.learned(self.codec)
        if new_tags:
            self.forget()
        return True

    def reset_after_fork(self) -> None:
        """A forked child refolds every session from the engine (see SessionTable)."""
        self._closing = threading.Lock()
        self._learning = threading.Lock()
        self.sessions.reset_after_fork()
        self.caches.reset_after_fork()

    def _dropped(self, sess: SessionState) -> None:
        # a session past the `cached_sessions` bound: its caches saved, and what the
        # engine keeps of it freed too (else a process touching many sessions grows)
        self.caches.save_caches(sess)
        self.engine.let_go(sess.session_id)

    def close(self) -> None:
        """Save the caches worth saving, forget every session and release the engine."""
        for sess in self.sessions.take_all() if not self.closed else []:
            self.caches.save_caches(sess)
        with self._closing:
            if not self.closed:
                self.closed = True
                self.engine.close()

    def check_open(self) -> None:
        if self.closed:
            raise StoreClosedError(f"the store at {self.url} is closed")

    def projection(self, projection: str | Projection[Any]) -> Projection[Any]:
        """The registered projection named `projection` (or named as that object is)."""
        name = projection if isinstance(projection, str) else getattr(projection, "name", None)
        found = self.projections.get(name) if isinstance(name, str) else None
        if found is None:
            known = ", ".join(sorted(self.projections))
            what = f"named {name!r}" if isinstance(name, str) else f"{projection!r} (no name)"
            raise UnknownProjectionError(f"no projection {what} is registered (known: {known})")
        return found

    # -- per-session state ------------------------------------------------------------

    def session(self, session_id: str) -> SessionState:
        """The session's state (kept, or new); checks the store is open and the id."""
        if self.closed:
            self.check_open()
        try:
            sess = self.sessions.by_id.get(session_id)
        except TypeError:  # unhashable, so not a str: validate_session_id says so
            sess = None
        if sess is None:
            validate_session_id(session_id)
            sess = self.sessions.open(session_id)
            if self.keys is not None:
                self.keys.note(session_id)
        return sess

    def refuse_encrypted(self, session_id: str, what: str) -> None:
        """EncryptedSessionError if the session has a data key (it is encrypted): `what`
        would write its state in the clear (a snapshot). Nothing was written."""
        engine = self.engine
        if isinstance(engine, KeyEngine) and engine.load_key_slot(key_id_of(session_id)):
            raise EncryptedSessionError(
                f"session {session_id!r} is encrypted: {what} would write its events or"
                " state in the clear; nothing was written"
            )

    def snapshot_cipher(self, session_id: str, what: str, first: bool = False) -> DataKey | None:
        """The data key a snapshot of the session is sealed with (a store with keys seals
        every snapshot it writes); None for a plain session of a store without keys, and
        EncryptedSessionError (`what` would write the states in the clear) for an
        encrypted one. `first`: the snapshot starts the session (a fork:
        `SessionKeys.for_writing`)."""
        if self.keys is not None:
            return self.keys.for_writing(session_id, first)
        self.refuse_encrypted(session_id, what)
        return None

    def cipher_for(
        self, session_id: str, events: Sequence[Event], first: bool = False
    ) -> DataKey | None:
        """The data key `events` are sealed with (None: written plain, by a store without
        keys, or maintenance records); KeyForgottenError once the key was destroyed.
        `first`: the batch starts the session (`SessionKeys.for_writing`)."""
        if self.keys is None:
            # a store without keys never writes plain payloads into an encrypted session
            # (checked once per session this store opens: one lookup, not one per append)
            if session_id not in self._plain and not _never_encrypted(events):
                self.refuse_encrypted(session_id, "a store without keys appending to it")
                self._plain.add(session_id)
            return None
        if _never_encrypted(events):
            return None
        return self.keys.for_writing(session_id, first)

    def forget(self, session_id: str | None = None) -> None:
        """Forget what is kept of the session (every session: None), as when its log was
        replaced, removed or repaired by this store: the next use refolds from the
        engine. Nothing is saved; what the session held of the creation budget is
        given back."""
        if session_id is None:
            sessions = list(self.sessions.by_id.values())
        else:
            found = self.sessions.get(session_id)
            sessions = [] if found is None else [found]
        for sess in sessions:
            with sess.lock:
                self.caches.release(sess)
                sess.forget()

    def has_fold(self, session_id: str, name: str) -> bool:
        """Whether this store keeps a folded state of projection `name` of the session."""
        sess = self.sessions.get(session_id)
        return sess is not None and name in sess.folds

    def cache_info(self, session_id: str) -> SessionCacheInfo:
        """What is kept in memory of the session (see SessionCacheInfo)."""
        sess = self.session(session_id)
        with sess.lock:
            folds = {
                name: (f.head.seq, None if f.saved is None else f.saved.seq)
                for name, f in sess.folds.items()
            }
            prefix = None if sess.prefix is None else sess.prefix.size
            return SessionCacheInfo(folds, prefix, len(sess.checked_snapshots))

    # -- folding ------------------------------------------------------------------------

    def loaded(self, session_id: str, proj: Projection[S], view: Callable[[S], T]) -> T:
        """`view(state)` of the caught-up state: what a load returns (the caller's own).

        Made under the session's lock: a writer folds its batch into the state in place,
        event by event, so a copy made after the lock is released could hold part of a
        batch. A cold load (the first of `proj` here) of a projection in `pause_gc` folds
        the whole log with the cyclic collector paused (eventstore.core.gc_pause)."""
        sess = self.session(session_id)
        cold = proj.name not in sess.folds and proj.name in self.pause_gc
        with sess.lock, paused_gc if cold else _NO_PAUSE:
            return view(self.catch_up(sess, proj))

    def loaded_if_kept(
        self, session_id: str, proj: Projection[S], view: Callable[[S], T]
    ) -> T | None:
        """`loaded`, when that folds only what was appended after a state this store
        keeps or a fold cache the engine keeps (and checks); None, nothing folded, when
        it would fold a log from its start (an empty one is folded: it costs nothing).
        For a state worth keeping only where it comes cheap (an index of lines)."""
        sess = self.session(session_id)
        with sess.lock:
            if proj.name not in sess.folds:
                # (the cache alone: the log from its start is not wanted)
                f = self.caches.first_fold(sess, proj, start=False)
                if f.head.position is None and self.engine.head(session_id).seq:
                    return None
                sess.folds[proj.name] = f
            return view(self.catch_up(sess, proj))

    def catch_up(self, sess: SessionState, proj: Projection[S]) -> S:
        """Fold what was appended since the cached head (the log may have been replaced).
        Called with the session's lock held."""
        f = sess.folds.get(proj.name)
        if f is None:
            f = sess.folds[proj.name] = self._first_fold(sess, proj)
        mark = self.caches.start_mark(sess, f) if f.head.position is None else None
        try:
            try:
                folded = fold_log(self._fold_context, sess, proj, f, mark)
            except Exception as exc:
                if mark is None:
                    raise
                # fold again from the start, checking every line (which reports whatever
                # is wrong): nothing folded from bytes the mark did not prove is kept
                log.debug("eventstore: checked prefix of %r not used: %r", sess.session_id, exc)
                sess.prefix = None
                f.state, f.head = proj.initial(), EMPTY_HEAD
                folded = fold_log(self._fold_context, sess, proj, f, None)
        except BaseException:
            # a piece may be half folded in place, or folded from bytes the mark did not
            # prove (an error, or an interrupt such as KeyboardInterrupt): the next load
            # folds from where this store's first fold starts, never on top of it
            sess.folds.pop(proj.name, None)
            raise
        self.caches.after_fold(sess, proj, f, folded)
        return f.state  # type: ignore[no-any-return]

    def _first_fold(self, sess: SessionState, proj: Projection[S]) -> Fold:
        """Where this process starts folding `proj`: from the last line alone for a
        projection that only it decides (`eventstore.core.last_line`), else the fold
        cache or the beginning."""
        if last_line_only(proj):
            seeded = last_line_fold(self.engine, self.codec, sess.session_id, proj)
            if seeded is not None:
                return seeded
        return self.caches.first_fold(sess, proj)

    def seed_from_tail(
        self, session_id: str, head: Head, lines: Mapping[int, SeqLine], where: str
    ) -> None:
        """Give a session this store has neither seen the head of nor folded the
        lifecycle state of that state, from its head's line among `lines`, read with
        `head` in one read by the caller (`SeqEngine.tail`, reading the log's newest
        lines), and `head` as its head; nothing when that line is not among them or
        does not check (`last_line.head_line`).

        The state is what a write's own first read of the last line would judge on
        (`last_line_fold`: the same checks), as fresh as that read, and a write judged
        on it appends only at `head` (a state this store keeps at its head is judged
        with no read): anything written after the caller's read moves the head, so the
        write reads the log and judges again. It saves a cold write after a read of
        the log's end (an Agents SDK `pop_item`) its read of the last line."""
        if head.seq == 0:
            return
        sess = self.session(session_id)
        proj = self.lifecycle
        with sess.lock:
            if sess.head is not None or proj.name in sess.folds:
                return  # (what this store saw may be newer than the caller's read)
            ev = head_line(self.codec, where, head, lines)
            f = None if ev is None else fold_of_last_line(proj, ev, head)
            if f is not None:
                sess.folds[proj.name] = f
                sess.head = head

    def fold_to_one_head(
        self, sess: SessionState, projections: tuple[Projection[Any], ...]
    ) -> tuple[Head, list[Any]]:
        """Catch every projection up to the same head (re-reading if an append landed
        between two of the reads). Called with the session's lock held."""
        while True:
            states = [self.catch_up(sess, p) for p in projections]
            heads = {
                (sess.folds[p.name].head.seq, sess.folds[p.name].head.link) for p in projections
            }
            if len(heads) == 1:
                return sess.folds[projections[-1].name].head, states

    # -- writing ------------------------------------------------------------------------

    def write_events(
        self,
        session_id: str,
        events: list[Event],
        idempotency_key: str | None,
        *,
        check: bool = False,
    ) -> AppendResult:
        """Append `events`, which need no validation against the session's state.

        `check`: the events hold the caller's records, unvalidated: encoding checks them
        (NotAsStoredError, nothing written)."""
        result = self.write(session_id, lambda h, s: events, idempotency_key, check=check)
        assert result is not None
        return result

    def write(
        self,
        session_id: str,
        build: Build,
        idempotency_key: str | None,
        needs: tuple[Projection[Any], ...] = (),
        *,
        check: bool = False,
        after_tombstone: bool = False,
        share_flush: bool = True,
    ) -> AppendResult | None:
        """The one write path: fold what `build` needs, build (validate), append against
        the head those folds reached; on a moved head, catch up and do it again; then
        fold the batch into the states that were at that head.

        Returns None when `build` returned no events (nothing to write). A key seen
        before returns that batch's result with `replayed=True`, writing nothing; whether
        it was the same request is the caller's to check (`fingerprint`).

        A session whose log ends in a tombstone takes no write: SessionDeletedError,
        nothing written; the lifecycle projection is folded for every write to know it
        (the expected-head check makes that race-free against a delete in another
        process). `after_tombstone`: do not check (the delete itself, which is given the
        lifecycle state among `needs`).

        `share_flush`: False when the caller holds the session's lock around this call
        (a writer that waits for a shared flush must have released it: the writers
        queued behind it commit the flush): no turn is taken (`Engine.turn`)."""
        if idempotency_key is not None:
            check_key(idempotency_key)
        sess = self.session(session_id)
        if idempotency_key is None and not needs:
            wanted = () if after_tombstone else self._just_lifecycle
        else:
            wanted = (self.idempotency, *needs) if idempotency_key is not None else needs
            if not after_tombstone:
                wanted = (self.lifecycle, *wanted)
        turn = self.engine.turn(session_id) if share_flush else None
        if turn is not None:
            return self._write_in_turn(sess, turn, build, idempotency_key, wanted, check,
                                       after_tombstone)  # fmt: skip
        try:
            with sess.lock:
                result = self._write_locked(
                    sess, None, build, idempotency_key, wanted, check, after_tombstone
                )
                # the caches a write keeps, under the lock it holds
                if result is not None and self.caches.after_writes and not result.replayed:
                    self.caches.after_write(sess)
        except StorageError:
            self._forget_folded(sess)  # (see _write_in_turn)
            raise
        return result

    def _write_in_turn(
        self,
        sess: SessionState,
        turn: WriterTurn,
        build: Build,
        idempotency_key: str | None,
        wanted: tuple[Projection[Any], ...],
        check: bool,
        after_tombstone: bool,
    ) -> AppendResult | None:
        """`write` within the engine's turn around the lock: with `durability="fsync"`
        a writer with others queued behind it leaves its flush to them and waits for it
        on leaving the turn, after the lock (group commit:
        `eventstore.engines.file.groupflush`)."""
        try:
            with turn, sess.lock:
                turn.start()
                try:
                    result = self._write_locked(
                        sess, turn, build, idempotency_key, wanted, check, after_tombstone
                    )
                finally:
                    if turn.finish():  # a group this writer committed failed
                        self._forget_folded(sess)
        except StorageError:
            # a group commit may have failed (this writer's, or one it waited for):
            # batches folded here were never stored
            self._forget_folded(sess)
            raise
        # the caches a write keeps: after the shared flush, out of the turn (no writer
        # queued for the flush waits for these cache writes)
        if result is not None and self.caches.after_writes and not result.replayed:
            with sess.lock:
                self.caches.after_write(sess)
        return result

    def _forget_folded(self, sess: SessionState) -> None:
        """Drop what is folded of the session: the next use refolds from the log."""
        with sess.lock:
            self.caches.release(sess)
            sess.forget()

    def _write_locked(
        self,
        sess: SessionState,
        turn: WriterTurn | None,
        build: Build,
        key: str | None,
        wanted: tuple[Projection[Any], ...],
        check: bool,
        after_tombstone: bool,
    ) -> AppendResult | None:
        """`write` under the session's lock, within the engine's turn if it has one."""
        session_id = sess.session_id
        written = self._append(sess, turn, build, key, wanted, check, after_tombstone)
        if written.__class__ is not tuple:
            return written  # type: ignore[return-value]  # a replay, or nothing to write
        head, new, data, stamped = written
        if head.seq == 0 and head.position is None and self.caches.marks:
            self.caches.keep_from_creation(sess, head)
        elif sess.kept_from_creation >= 0:
            self.caches.count_kept(sess, len(data))
        # the states that were at that head advance to `new` without reading the
        # batch back (inline: this loop runs for every append)
        kinds = frozenset(map(type, stamped))
        reading = self.reading
        skip = reading.skips.get(kinds)
        if skip is None:
            skip = reading.skipping(kinds)
        for name, f in sess.folds.items():
            fh = f.head  # (identity first: a fold this store left at its own head)
            if fh is not head and (fh.seq != head.seq or fh.position != head.position):
                continue
            if name in skip:
                f.head = new  # nothing it reads: its state stays as it is
                continue
            proj = self.projections[name]
            try:
                # a user's apply may change the event it gets (the built-in states,
                # and those that say it never does, share its records): it folds
                # the batch decoded from the bytes written, as a cold load would
                # give it to it
                own = (
                    stamped
                    if name in self.sharing
                    else self.codec.decoder(proj.event_types).decode_lines(data)
                )
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
        return AppendResult(stamped[0].seq, stamped[-1].seq, False)

    def _append(
        self,
        sess: SessionState,
        turn: WriterTurn | None,
        build: Build,
        key: str | None,
        wanted: tuple[Projection[Any], ...],
        check: bool,
        after_tombstone: bool = True,
    ) -> AppendResult | None | tuple[Head, Head, bytes, list[Event]]:
        """The retry loop of `write`, under the session's lock: a replay's result, None
        (nothing to write), or (the head appended to, the new head, the bytes, the
        stamped events)."""
        head = sess.head
        fresh = False  # whether `head` was read from the engine during this call
        while True:
            states: list[Any] = []
            if wanted:
                # the states this store left at its own head: no read. The append is
                # conditional on that head, so a stale one costs a retry only
                if fresh or head is None or (kept := _states_at(sess.folds, wanted, head)) is None:
                    head, states = self.fold_to_one_head(sess, wanted)
                    fresh = True
                else:
                    states = kept
                if not after_tombstone:
                    tombstone = states.pop(0).deleted
                    if tombstone is not None:
                        if not fresh:
                            fresh = True  # judged on what this store kept: read it again
                            continue
                        raise SessionDeletedError(sess.session_id, tombstone.ts, tombstone.by)
                if key is not None:
                    seen = states.pop(0).get(key)
                    if seen is not None:
                        if not fresh:
                            fresh = True  # a replay answers from the log as it is now
                            continue
                        return AppendResult(seen[0], seen[1], replayed=True)
            elif head is None:
                head = sess.head = self.engine.head(sess.session_id)
                fresh = True
            try:
                events = build(head, states)
            except EventStoreError:
                if fresh:
                    raise
                fresh = True  # judged against a cached head or state: read them, judge again
                if not wanted:
                    head = self.engine.head(sess.session_id)
                continue
            if not events:
                return None
            now = entropy.now()
            data, stamped, link = self.codec.encode_batch(
                events, head.seq + 1, head.link, now, key, check=check,
                cipher=self.cipher_for(sess.session_id, events, first=head.seq == 0),
            )  # fmt: skip
            last = events[-1]
            batch = EncodedBatch(
                data,
                stamped[0].seq,
                stamped[-1].seq,
                tuple(map(_get_h, stamped)),
                link,
                key,
                fingerprint(events) if key is not None else None,
                # what an indexing engine keeps: the time, and the labels a batch sets
                micros(now),
                last.labels if type(last) is LabelsSet else None,
            )
            try:
                if turn is None:
                    new = self.engine.append(sess.session_id, batch, head)
                else:
                    new = turn.append(batch, head)
                return head, new, data, stamped
            except HeadMovedError as exc:
                if exc.actual.same_chain_point(head):
                    raise  # an engine refusing the head it reports: retrying cannot help
                head = sess.head = exc.actual
                fresh = True


class _Reading:
    """What a writer skips: the event classes each projection saying
    `ignores_other_types` reads (`reads`), and the projections a batch of a set of
    classes skips (`skips`), worked out once per set (a store writes a few kinds of
    batch). Never changed once made but for that memo: `learn` makes a new one."""

    __slots__ = ("reads", "skips")

    def __init__(self, reads: dict[str, frozenset[type[Event]]]) -> None:
        self.reads = reads
        self.skips: dict[frozenset[type[Event]], frozenset[str]] = {}

    def skipping(self, kinds: frozenset[type[Event]]) -> frozenset[str]:
        """The projections a batch of the event classes `kinds` is not folded into."""
        skip = frozenset(name for name, reads in self.reads.items() if reads.isdisjoint(kinds))
        if len(self.skips) >= 256:
            self.skips.clear()  # (a writer of ever new mixes of types: bounded)
        self.skips[kinds] = skip
        return skip


# maintenance records hold no user content, a seal (a signed head) is checked with a
# public key by whoever holds no data key, and a tombstone must refuse writes even after
# `forget_key`: never encrypted
_NEVER_ENCRYPTED = (KeyForgotten, Quarantined, ArchivePruned, Sealed, SessionDeleted)


def _never_encrypted(events: Sequence[Event]) -> bool:
    return all(isinstance(ev, _NEVER_ENCRYPTED) for ev in events)


def check_options(cached_sessions: object, caches: object, tuning: object) -> None:
    """InvalidArgumentError unless the core's options are usable (checked by a store
    before it opens its engine, so a refused option creates nothing)."""
    if type(cached_sessions) is not int or cached_sessions < 1:
        raise InvalidArgumentError(f"cached_sessions must be an int >= 1, got {cached_sessions!r}")
    if not isinstance(caches, bool):
        raise InvalidArgumentError(f"caches must be a bool, got {caches!r}")
    if tuning is not None and not isinstance(tuning, Tuning):
        raise InvalidArgumentError(f"tuning must be a Tuning, got {tuning!r}")


class HasCore(Protocol):
    """Anything built on a session core (a `SessionStore`): the operations take it too."""

    @property
    def core(self) -> SessionCore: ...


CoreOwner = SessionCore | HasCore
"""What an operation takes: a session core, or what holds one (a `SessionStore`)."""


def core_of(owner: CoreOwner) -> SessionCore:
    """The session core of `owner`: itself, or the core a `SessionStore` is built on."""
    return owner if isinstance(owner, SessionCore) else owner.core


def _states_at(
    folds: dict[str, Fold], projections: Sequence[Projection[Any]], head: Head
) -> list[Any] | None:
    """The states of `projections` if every one has a fold at exactly `head` (the same
    object, or one at the same seq and position: a load of one projection gives the
    session a new head object that the others, folded by the last write, are still at),
    else None."""
    states = []
    for p in projections:
        f = folds.get(p.name)
        if f is None:
            return None
        fh = f.head
        if fh is not head and (fh.seq != head.seq or fh.position != head.position):
            return None
        states.append(f.state)
    return states


_get_h = attrgetter("h")
