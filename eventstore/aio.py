"""`AsyncSessionStore`: the session API as coroutines, for asyncio programs.

Every call runs the blocking `SessionStore` method in a bounded thread pool, so the
event loop never waits on a lock, a file or a fold. Calls on one session run one after
another in the order they were submitted (the order their coroutines started), from
whichever event loop or thread; calls on different sessions run in parallel, up to
`max_workers` at a time. A call waiting for its turn holds no thread: each session has
a queue (its lane), and only the call at the head of a lane occupies a worker; when it
ends, the next one starts.

What a call raises in its worker (a `ConcurrencyError`, a `FeatureNotFoundError`, ...) is
raised, unchanged, by the coroutine. A caller cancelled while its call waits for its
turn (in its lane, or for a free worker) withdraws the call (it never runs); a call
already running in a worker runs to completion (a thread cannot be stopped halfway
through an append), and the next call on that session waits for it.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from eventstore import process
from eventstore.core.session_core import DEFAULT_CACHED_SESSIONS, SessionCacheInfo
from eventstore.core.validation import described
from eventstore.engines.base import Durability
from eventstore.errors import (
    InvalidArgumentError,
    InvalidSessionIdError,
    StoreClosedError,
)
from eventstore.format.events import Event
from eventstore.ops.compaction import (
    CompactionReport,
    Retention,
)
from eventstore.ops.lifecycle import ExpiryResult, PruneReport
from eventstore.ops.listing import SessionInfo
from eventstore.ops.retention import GcReport, Policy
from eventstore.ops.tombstone import Tombstone
from eventstore.records import (
    BootstrapState,
    FeatureRecord,
    Message,
    ProgressEntry,
    RunCheckpoint,
    SessionManifest,
)
from eventstore.store import (
    AppendResult,
    AutoCompact,
    SessionStore,
)

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

    from eventstore.format.crypt import KeyRing
    from eventstore.format.events import Upcaster
    from eventstore.ops.audit import VerifyReport
    from eventstore.ops.fork import ForkResult
    from eventstore.ops.seal import SealFacts
    from projections import Projection

__all__ = ["DEFAULT_MAX_WORKERS", "AsyncSessionStore"]

T = TypeVar("T")
_Lane = deque[tuple[Callable[[], Any], "asyncio.Future[Any]"]]

DEFAULT_MAX_WORKERS = 4
_STORE_WIDE = object()  # the lane of calls that concern no one session (list_sessions)


class AsyncSessionStore:
    """`SessionStore` with every method as a coroutine; usable with `async with`.

    `root_or_url` is what `SessionStore` takes (a directory, or a store URL where the
    engine supports one), or an open `SessionStore` to share: a store passed in is not
    closed by `close()`; one created here is. The other arguments go to `SessionStore`.
    `max_workers` bounds the threads doing blocking work (default 4). `store` is the
    underlying `SessionStore`.
    """

    def __init__(
        self,
        root_or_url: str | os.PathLike[str] | SessionStore,
        durability: Durability = "flush",
        *,
        event_types: Iterable[type[Event]] = (),
        projections: Iterable[Projection[Any]] = (),
        upcasters: Iterable[tuple[type[Event], int, Upcaster]] = (),
        auto_compact: AutoCompact | None = None,
        cached_sessions: int = DEFAULT_CACHED_SESSIONS,
        max_workers: int = DEFAULT_MAX_WORKERS,
    ) -> None:
        if not isinstance(max_workers, int) or isinstance(max_workers, bool) or max_workers < 1:
            raise InvalidArgumentError(f"max_workers must be an int >= 1, not {max_workers!r}")
        if isinstance(root_or_url, SessionStore):
            self.store = root_or_url
            self._owns_store = False
        else:
            self.store = SessionStore(
                root_or_url,
                durability,
                event_types=event_types,
                projections=projections,
                upcasters=upcasters,
                auto_compact=auto_compact,
                cached_sessions=cached_sessions,
            )
            self._owns_store = True
        self._max_workers = max_workers
        self._pool = ThreadPoolExecutor(max_workers, thread_name_prefix="eventstore-aio")
        # each session's calls in submission order, the running one first, whichever
        # event loop (thread) submitted them: one lane per session across loops
        self._lanes: dict[object, _Lane] = {}
        self._follows: set[threading.Event] = set()  # the stop events of running follows
        self._guard = threading.Lock()
        # follows' reads in flight: the store is closed only once they are over
        self._polls = 0
        # notified as a follow's read or a lane ends: close() waits for both to be none
        self._quieter = threading.Condition(self._guard)
        self._closed = False
        # the closing begun by the first close(), which every close() awaits
        self._released: Future[None] | None = None
        # set in a worker while it runs a call's function (`_run`): close() from there
        # cannot wait for the closing, which waits for that very call
        self._in_call = threading.local()
        process.track(self)

    def reset_after_fork(self) -> None:
        """In a forked child: none of the parent's threads (workers, its closing, the
        follows' reads) exist here, so calls would wait forever for them. The parent's
        calls and follows are its own (their futures belong to its loops): the child
        starts with no lanes, fresh workers and locks, and a closing of its own."""
        self._guard = threading.Lock()
        self._quieter = threading.Condition(self._guard)
        self._lanes = {}
        self._follows = set()
        self._polls = 0
        self._pool = ThreadPoolExecutor(self._max_workers, thread_name_prefix="eventstore-aio")
        if self._released is not None and not self._released.done():
            self._released = None  # (begun by a thread that is not here)

    # -- lifecycle --------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once `close()` has begun: new calls raise StoreClosedError."""
        return self._closed

    async def close(self) -> None:
        """Refuse new calls, end every `follow`, wait for every call already submitted
        to run (and a follow's read under way), then release the threads (and close the
        underlying store if this object opened it).

        A call submitted from another event loop is waited for in the workers, not on
        its loop: one stopped (and not closed) still has its calls run, and its callers
        hear of them when it runs again. The closing runs in a thread of its own, begun
        by the first `close()`: a close cancelled (or timed out) once begun still
        finishes, and another `close()` waits for that one (raising what it raised),
        never begins a second. A `close()` from a function `call` runs on this store
        begins the closing and returns: the closing waits for that call to end."""
        loop = asyncio.get_running_loop()
        with self._guard:
            self._closed = True
            here = [f for lane in self._lanes.values() for _, f in lane if f.get_loop() is loop]
            for stop in self._follows:
                stop.set()
            released = self._released
            if released is None:
                released = self._released = Future()
                # running: a cancelled close() cannot cancel it (others await it)
                released.set_running_or_notify_cancel()
                closer = threading.Thread(
                    target=self._release, args=(released,), name="eventstore-aio-close"
                )
                try:
                    closer.start()
                except BaseException as exc:  # (a close() awaiting it would wait forever)
                    released.set_exception(exc)
        if getattr(self._in_call, "running", False):
            return  # (waiting here for the closing, which waits for this call, would hang)
        if here:  # (their callers hear of them before close returns)
            await asyncio.wait(here)
        await asyncio.wrap_future(released)

    def _release(self, released: Future[None]) -> None:
        try:
            with self._guard:
                # every lane drains in the workers whatever became of its callers' loops
                # (a future of a stopped loop is never done: waiting for it hung close)
                while self._lanes or self._polls:
                    self._quieter.wait()
            self._pool.shutdown(wait=True)
            if self._owns_store:
                self.store.close()
        except BaseException as exc:  # (told to every close() awaiting it)
            released.set_exception(exc)
        else:
            released.set_result(None)

    async def __aenter__(self) -> AsyncSessionStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def projections(self) -> dict[str, Projection[Any]]:
        """The projections the store folds, by name (built-in and user-defined)."""
        return self.store.projections

    # -- the per-session lanes --------------------------------------------------------

    async def call(self, session_id: str, fn: Callable[[], T]) -> T:
        """Run `fn()` in a worker, in `session_id`'s order (after every call on that
        session submitted before it, before every call submitted after it).

        The building block of every method here; integrations use it to run several
        store operations on one session as one step.
        A `fn` that is not callable, or an async function (a worker cannot run its
        coroutine), is refused (InvalidArgumentError naming the session); so is a call
        whose `fn()` returns a coroutine, which is closed unrun.
        """
        if not callable(fn) or inspect.iscoroutinefunction(fn):
            raise InvalidArgumentError(
                f"session {session_id!r}: fn must be a plain function to run in a worker,"
                f" not {described(fn)}"
            )
        return await self._submit(session_id, fn)

    async def _submit(self, lane_key: object, fn: Callable[[], T]) -> T:
        try:
            hash(lane_key)  # a lane is keyed by it (integrations key lanes of their own)
        except TypeError:
            raise InvalidSessionIdError(
                f"session id must be a str, got {type(lane_key).__name__}"
            ) from None
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        with self._guard:
            if self._closed:
                raise StoreClosedError("the async store is closed")
            lane = self._lanes.get(lane_key)
            if lane is None:
                lane = self._lanes[lane_key] = deque()
            lane.append((fn, fut))
            first = len(lane) == 1
        if first:
            self._start_next(lane_key, lane)
        return await fut

    def _start_next(self, lane_key: object, lane: _Lane, *, ended: bool = False) -> None:
        """Hand the lane's head to a worker, skipping calls withdrawn while they waited
        (called on the loop of a call that found its lane empty, or in the worker of
        the call before, which has `ended`: it leaves the lane under the same lock, so
        a call submitted meanwhile is started once, here or by its own submit)."""
        with self._guard:
            if ended:
                lane.popleft()
            while lane:
                fn, fut = lane[0]
                if not fut.cancelled():
                    break
                lane.popleft()
            else:
                del self._lanes[lane_key]
                self._quieter.notify_all()
                return
        try:
            self._pool.submit(self._run, lane_key, lane, fn, fut)
        except RuntimeError:
            # the interpreter is exiting: its pools take no more work (they are shut
            # before its other threads are joined), yet a thread still running its loop
            # awaits this call, and close() the lane's end; the call gets a thread of
            # its own, as does each after it, so the lane drains and the exit ends
            threading.Thread(
                target=self._run, args=(lane_key, lane, fn, fut), name="eventstore-aio-exit"
            ).start()

    def _run(
        self, lane_key: object, lane: _Lane, fn: Callable[[], Any], fut: asyncio.Future[Any]
    ) -> None:
        """In a worker: the call (unless its caller was cancelled while it waited for a
        free worker), its outcome to the caller's loop, then the next call of its lane.
        The lane moves on here, not on that loop: a loop closed or stopped under a call
        its caller gave up on holds up no other loop's calls on the session."""
        result: Any = None
        error: BaseException | None = None
        if not fut.cancelled():
            self._in_call.running = True
            try:
                result = fn()
            except BaseException as exc:  # (the pool's own worker catches these too)
                error = exc
            finally:
                self._in_call.running = False
            if inspect.iscoroutine(result):
                # returned unrun, it would answer the call as done: nothing of it ran
                result.close()
                result, error = (
                    None,
                    InvalidArgumentError(
                        f"session {lane_key!r}: the call returned a coroutine, which a worker"
                        " cannot run (give `call` a plain function)"
                    ),
                )
        try:  # (before the next call starts: callers hear of their calls in order)
            fut.get_loop().call_soon_threadsafe(_settle, fut, result, error)
        except RuntimeError:  # the loop was closed under a call its caller gave up on
            pass
        self._start_next(lane_key, lane, ended=True)

    # -- the session API --------------------------------------------------------------

    async def is_initialized(self, session_id: str, *, idempotency_key: str | None = None) -> bool:
        """True once the session has a manifest (`idempotency_key`: see the store's)."""
        return await self._submit(
            session_id,
            lambda: self.store.is_initialized(session_id, idempotency_key=idempotency_key),
        )

    async def initialize_session_if_missing(
        self,
        session_id: str,
        manifest: SessionManifest,
        feature_list: Sequence[FeatureRecord],
        initial_progress_entry: ProgressEntry | None = None,
        initial_checkpoint: RunCheckpoint | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> bool:
        """One atomic batch; False (and no change) if the session has a manifest."""
        return await self._submit(
            session_id,
            lambda: self.store.initialize_session_if_missing(
                session_id,
                manifest,
                feature_list,
                initial_progress_entry,
                initial_checkpoint,
                idempotency_key=idempotency_key,
            ),
        )

    async def load_bootstrap_state(
        self, session_id: str, *, idempotency_key: str | None = None
    ) -> BootstrapState:
        """The manifest, features, progress and checkpoints; `BootstrapState()` if unknown."""
        return await self._submit(
            session_id,
            lambda: self.store.load_bootstrap_state(session_id, idempotency_key=idempotency_key),
        )

    async def save_manifest(
        self, session_id: str, manifest: SessionManifest, *, idempotency_key: str | None = None
    ) -> AppendResult:
        """Replace the session's manifest."""
        return await self._submit(
            session_id,
            lambda: self.store.save_manifest(session_id, manifest, idempotency_key=idempotency_key),
        )

    async def append_progress_entry(
        self, session_id: str, entry: ProgressEntry, *, idempotency_key: str | None = None
    ) -> AppendResult:
        """Append a progress note."""
        return await self._submit(
            session_id,
            lambda: self.store.append_progress_entry(
                session_id, entry, idempotency_key=idempotency_key
            ),
        )

    async def replace_feature_list(
        self,
        session_id: str,
        features: Sequence[FeatureRecord],
        *,
        idempotency_key: str | None = None,
    ) -> AppendResult:
        """Replace the whole feature list; order is kept."""
        return await self._submit(
            session_id,
            lambda: self.store.replace_feature_list(
                session_id, features, idempotency_key=idempotency_key
            ),
        )

    async def update_feature_pass(
        self,
        session_id: str,
        feature_id: str,
        passes: bool,
        *,
        idempotency_key: str | None = None,
    ) -> AppendResult:
        """Set one feature's `passes`; FeatureNotFoundError (nothing written) if unknown."""
        return await self._submit(
            session_id,
            lambda: self.store.update_feature_pass(
                session_id, feature_id, passes, idempotency_key=idempotency_key
            ),
        )

    async def record_run_checkpoint(
        self, session_id: str, checkpoint: RunCheckpoint, *, idempotency_key: str | None = None
    ) -> AppendResult:
        """Append a run checkpoint."""
        return await self._submit(
            session_id,
            lambda: self.store.record_run_checkpoint(
                session_id, checkpoint, idempotency_key=idempotency_key
            ),
        )

    async def load_transcript_messages(
        self,
        session_id: str,
        *,
        start: int | None = None,
        limit: int | None = None,
        last: int | None = None,
        idempotency_key: str | None = None,
    ) -> list[Message]:
        """Transcript messages in append order, or a page of them (`last=N`, `start=`,
        `limit=`: see `SessionStore.load_transcript_messages`); `[]` for an unknown
        session."""
        return await self._submit(
            session_id,
            lambda: self.store.load_transcript_messages(
                session_id, start=start, limit=limit, last=last, idempotency_key=idempotency_key
            ),
        )

    async def append_transcript_messages(
        self,
        session_id: str,
        messages: Sequence[Message],
        *,
        idempotency_key: str | None = None,
    ) -> AppendResult:
        """Append messages as one atomic event."""
        return await self._submit(
            session_id,
            lambda: self.store.append_transcript_messages(
                session_id, messages, idempotency_key=idempotency_key
            ),
        )

    # -- the lower-level API ----------------------------------------------------------

    async def append(
        self,
        session_id: str,
        events: Sequence[Event],
        *,
        expected_seq: int | None = None,
        expected_h: str | None = None,
        idempotency_key: str | None = None,
    ) -> AppendResult:
        """Append typed events as one atomic batch (see `SessionStore.append`)."""
        return await self._submit(
            session_id,
            lambda: self.store.append(
                session_id,
                events,
                expected_seq=expected_seq,
                expected_h=expected_h,
                idempotency_key=idempotency_key,
            ),
        )

    async def append_decided(
        self,
        session_id: str,
        projection: str | Projection[Any],
        decide: Callable[[Any], Sequence[Event]],
    ) -> AppendResult | None:
        """Append what `decide(state)` returns, judged against the projection's state
        (see `SessionStore.append_decided`; `decide` runs on the store's worker)."""
        return await self._submit(
            session_id, lambda: self.store.append_decided(session_id, projection, decide)
        )

    async def last_seq(self, session_id: str) -> int:
        """The session's last committed sequence number (0 if it has none)."""
        return await self._submit(session_id, lambda: self.store.last_seq(session_id))

    async def load(self, session_id: str, projection: str | Projection[Any]) -> Any:
        """The current state of any registered projection (a copy)."""
        return await self._submit(session_id, lambda: self.store.load(session_id, projection))

    async def list_sessions(self, prefix: str | None = None) -> list[str]:
        """The original ids of every session in the store (those starting with
        `prefix`), sorted (see `SessionStore.list_sessions`)."""
        return await self._submit(_STORE_WIDE, lambda: self.store.list_sessions(prefix))

    async def sessions(
        self,
        prefix: str | None = None,
        *,
        after: SessionInfo | str | None = None,
        limit: int | None = None,
        order: str = "updated",
        labels: Mapping[str, str] | None = None,
        updated_since: datetime | str | None = None,
    ) -> list[SessionInfo]:
        """A page of the store's sessions from its session index (see
        `SessionStore.sessions`)."""
        return await self._submit(
            _STORE_WIDE,
            lambda: self.store.sessions(
                prefix,
                after=after,
                limit=limit,
                order=order,
                labels=labels,
                updated_since=updated_since,
            ),
        )

    async def set_labels(
        self, session_id: str, labels: Mapping[str, str], *, idempotency_key: str | None = None
    ) -> AppendResult:
        """Give the session these labels, as one event (see `SessionStore.set_labels`)."""
        return await self._submit(
            session_id,
            lambda: self.store.set_labels(session_id, labels, idempotency_key=idempotency_key),
        )

    async def rebuild_index(self) -> int:
        """Rebuild the session index from the logs (see `SessionStore.rebuild_index`)."""
        return await self._submit(_STORE_WIDE, self.store.rebuild_index)

    async def gc(
        self,
        policy: Policy | None = None,
        *,
        dry_run: bool = False,
        now: datetime | None = None,
    ) -> GcReport:
        """Apply a retention policy to every session (see `SessionStore.gc`)."""
        return await self._submit(
            _STORE_WIDE, lambda: self.store.gc(policy, dry_run=dry_run, now=now)
        )

    async def feed(self, after: Any = None, limit: int = 1000) -> list[tuple[Any, str, Event]]:
        """The global feed (see `SessionStore.feed`; PostgreSQL only)."""
        return await self._submit(_STORE_WIDE, lambda: self.store.feed(after, limit))

    async def delete_session(
        self, session_id: str, *, purge: bool = False, by: str | None = None
    ) -> bool:
        """Delete a session, leaving a tombstone unless `purge` (see
        `SessionStore.delete_session`); False if it did not exist. Runs after the calls
        on it submitted before."""
        return await self._submit(
            session_id, lambda: self.store.delete_session(session_id, purge=purge, by=by)
        )

    async def restore(self, session_id: str) -> bool:
        """Free a deleted session's id (see `SessionStore.restore`)."""
        return await self._submit(session_id, lambda: self.store.restore(session_id))

    async def tombstone_of(self, session_id: str) -> Tombstone | None:
        """The session's tombstone, or None (see `SessionStore.tombstone_of`)."""
        return await self._submit(session_id, lambda: self.store.tombstone_of(session_id))

    async def deleted_sessions(self) -> list[Tombstone]:
        """Every deleted session's tombstone (see `SessionStore.deleted_sessions`)."""
        return await self._submit(_STORE_WIDE, self.store.deleted_sessions)

    async def forget_key(self, session_id: str) -> bool:
        """Crypto-shredding: destroy the session's data key (see `SessionStore.forget_key`;
        give a `SessionStore` opened with `keys=`)."""
        return await self._submit(session_id, lambda: self.store.forget_key(session_id))

    async def rekey(self, new: KeyRing) -> tuple[int, int]:
        """Rewrap every data key with `new`'s current master key (see `SessionStore.rekey`)."""
        return await self._submit(_STORE_WIDE, lambda: self.store.rekey(new))

    async def delete_older_than(
        self,
        age: timedelta,
        *,
        now: datetime | None = None,
        dry_run: bool = False,
        purge: bool = False,
    ) -> list[ExpiryResult]:
        """Delete every session idle for longer than `age` (see
        `SessionStore.delete_older_than`)."""
        return await self._submit(
            _STORE_WIDE,
            lambda: self.store.delete_older_than(age, now=now, dry_run=dry_run, purge=purge),
        )

    async def learn(
        self, event_types: Iterable[type[Event]] = (), projections: Iterable[Projection[Any]] = ()
    ) -> bool:
        """Decode `event_types` and fold `projections` too, from now on (see
        `SessionStore.learn`); submitted store-wide, after every call before it."""
        types, projs = list(event_types), list(projections)
        return await self._submit(_STORE_WIDE, lambda: self.store.learn(types, projs))

    async def cache_info(self, session_id: str) -> SessionCacheInfo:
        """What the store keeps in memory for a session (see `SessionStore.cache_info`)."""
        return await self._submit(session_id, lambda: self.store.cache_info(session_id))

    async def forget_cached_state(self, session_id: str | None = None) -> None:
        """Drop what the store keeps in memory for a session, or every session."""
        key = _STORE_WIDE if session_id is None else session_id
        await self._submit(key, lambda: self.store.forget_cached_state(session_id))

    # -- audit, replay and compaction -------------------------------------------------

    async def first_kept_seq(self, session_id: str) -> int:
        """The first sequence number the session's history still holds."""
        return await self._submit(session_id, lambda: self.store.first_kept_seq(session_id))

    async def prune_archive(self, session_id: str, before: int | datetime) -> PruneReport:
        """Remove the archived segments wholly before `before`, recording what was
        removed (see `SessionStore.prune_archive`)."""
        return await self._submit(session_id, lambda: self.store.prune_archive(session_id, before))

    async def read_events(
        self,
        session_id: str,
        *,
        from_seq: int = 1,
        to_seq: int | None = None,
        types: Iterable[str | type[Event]] | None = None,
    ) -> list[Event]:
        """The events in the range, in sequence order (read in a worker, as a list)."""
        return await self._submit(
            session_id,
            lambda: list(
                self.store.read_events(session_id, from_seq=from_seq, to_seq=to_seq, types=types)
            ),
        )

    async def state_at(
        self, session_id: str, *, seq: int | None = None, at: datetime | None = None
    ) -> BootstrapState:
        """The bootstrap state as of sequence number `seq` or time `at`."""
        return await self._submit(
            session_id, lambda: self.store.state_at(session_id, seq=seq, at=at)
        )

    async def transcript_at(
        self, session_id: str, *, seq: int | None = None, at: datetime | None = None
    ) -> list[Message]:
        """The transcript as of sequence number `seq` or time `at`."""
        return await self._submit(
            session_id, lambda: self.store.transcript_at(session_id, seq=seq, at=at)
        )

    async def verify(
        self,
        session_id: str,
        *,
        public_key: Ed25519PublicKey | Ed25519PrivateKey | str | os.PathLike[str] | None = None,
        witness: str | os.PathLike[str] | None = None,
    ) -> VerifyReport:
        """Check a session's log and archive, and its seals with `public_key` or
        `witness` (see `SessionStore.verify`)."""
        return await self._submit(
            session_id,
            lambda: self.store.verify(session_id, public_key=public_key, witness=witness),
        )

    async def seal(self, session_id: str) -> SealFacts | None:
        """Seal the session's head with the store's signing key (see `SessionStore.seal`;
        give a `SessionStore` opened with `signing_key=` to seal)."""
        return await self._submit(session_id, lambda: self.store.seal(session_id))

    async def fork_session(
        self, source: str, session_id: str, at_seq: int | None = None
    ) -> ForkResult:
        """Start `session_id` from `source`'s state after `at_seq` (see
        `SessionStore.fork_session`)."""
        return await self._submit(
            session_id, lambda: self.store.fork_session(source, session_id, at_seq)
        )

    async def compact(
        self,
        session_id: str,
        *,
        archive: bool = True,
        retention: Retention | None = None,
        force: bool = False,
        dry_run: bool = False,
    ) -> CompactionReport:
        """Rewrite the session's log as one snapshot, atomically (skipped when it would
        not shrink, unless `force`; `dry_run` writes nothing: see `SessionStore.compact`)."""
        return await self._submit(
            session_id,
            lambda: self.store.compact(
                session_id, archive=archive, retention=retention, force=force, dry_run=dry_run
            ),
        )

    async def follow(
        self,
        session_id: str,
        *,
        from_seq: int = 1,
        poll_interval: float = 0.2,
    ) -> AsyncIterator[Event]:
        """Yield events as any process appends them, until the iterator is closed or
        the store is.

        The polling runs in the loop's default executor, not in one of the
        `max_workers`, so a long follow never holds up other calls.
        """
        stop = threading.Event()
        with self._guard:
            if self._closed:
                raise StoreClosedError("the async store is closed")
            self._follows.add(stop)
        it = self.store.follow(
            session_id, from_seq=from_seq, poll_interval=poll_interval, stop=stop
        )
        end = object()
        try:
            while True:
                ev = await asyncio.to_thread(self._poll, it, stop, end)
                if ev is end:
                    return
                assert isinstance(ev, Event)
                yield ev
        finally:
            stop.set()
            with self._guard:
                self._follows.discard(stop)

    def _poll(self, it: Iterator[Event], stop: threading.Event, end: object) -> object:
        """A follow's next event, read in a thread; `end` once `close()` has stopped it.
        `close()` waits for a read begun before it set `stop` (a store closed under a
        read would raise "the engine is closed" where the follow should just end)."""
        with self._guard:
            if stop.is_set():
                return end
            self._polls += 1
        try:
            return next(it, end)
        finally:
            with self._guard:
                self._polls -= 1
                self._quieter.notify_all()


def _settle(fut: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    """On the caller's loop: give the call's outcome to its caller, unless the caller was
    cancelled while the call ran (it gets no result)."""
    if fut.cancelled():
        return
    if isinstance(error, StopIteration):
        # a future refuses it (TypeError, and the caller would wait forever), or takes
        # a subclass that the caller's await then reads as its return value: a
        # RuntimeError caused by it, as PEP 479 turns one leaving a generator
        stop = error
        error = RuntimeError(f"the call raised StopIteration: {stop!r}")
        error.__cause__ = stop
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)
