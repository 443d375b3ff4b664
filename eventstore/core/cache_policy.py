"""When the session core reads and writes the caches that spare a cold load from folding
a whole log: the persistent fold caches (`eventstore.core.fold_cache`) and the checked
prefix (`eventstore.core.checked_prefix`), for engines that keep caches.

A fold cache is written on close (a store that creates a session folds its transcript as
it appends, within `Tuning.kept_from_creation`), after a long fold, by compaction, and
by a writer as its appends grow the log (`Tuning.cache_while_writing`), and used only
when it checks against the log; a state kept in frames (the transcript's,
about as large as the log) is written on close and by compaction only, once the log has
grown by an eighth; on an engine that keeps cache parts, its complete frames are written
once each as chunk caches by the writer's appends (`after_write`: it looks for one each
time they grow the log by `FRAME_LOOK`), and a close writes only the rest and the list
of chunks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from eventstore.core import checked_prefix, fold_cache
from eventstore.core.sessions import Fold, SessionState
from eventstore.core.tuning import Tuning
from eventstore.engines.base import EMPTY_HEAD, CacheReader, CachingEngine, Engine, Head
from eventstore.format.codec import EventCodec
from projections import Projection

if TYPE_CHECKING:
    from eventstore.signing import CacheMac

__all__ = ["FRAME_LOOK", "CachePolicy"]

FRAME_LOOK = 16 << 10
"""How much a writer's appends grow the log between two looks for a complete frame of a
state kept in chunks (a frame holds hundreds of events: a look per append costs more
than the frame it finds a few appends late)."""

_NEVER = 1 << 62  # a seq no log reaches


class CachePolicy:
    """The cache decisions of one core (see the module docstring). `marks`: whether
    checked prefixes are kept (the engine keeps caches, and caches are on)."""

    def __init__(
        self,
        engine: Engine,
        codec: EventCodec,
        projections: dict[str, Projection[Any]],
        builtin: frozenset[str],
        tuning: Tuning,
        enabled: bool,
        mac: CacheMac | None = None,
        crypt: fold_cache.CacheCrypt | None = None,
    ) -> None:
        self.engine = engine
        self.mac = mac  # a store with a cache key: its caches carry that key's MAC
        self.crypt = crypt  # a store with keys: fold caches sealed (eventstore.core.keys)
        self.projections = projections
        self.builtin = builtin
        self.tuning = tuning
        keeps = enabled and isinstance(engine, CachingEngine)
        self.marks = keeps
        self.cached: dict[str, str] = {}
        self.framed: frozenset[str] = frozenset()
        self.chunked: frozenset[str] = frozenset()
        self.learned(codec)
        self.kept_bytes = 0  # see keep_from_creation

    def learned(self, codec: EventCodec) -> None:
        """Decide again which folds are cached, and under what `known`, after the store
        learned event types or projections (`SessionCore.learn`)."""
        # the projections whose folds the engine's fold cache keeps, each with the event
        # types this store decodes of those it reads and how it upcasts them (a cache
        # folded knowing others, or upcasting another way, is another state)
        self.cached = (
            {
                name: fold_cache.known_types(p, codec.types, codec.reading)
                for name, p in self.projections.items()
                if name == "bootstrap" or getattr(p, "cache_folds", False) is True
            }
            if self.marks
            else {}
        )
        # those kept in frames (a transcript's: large states, written on close only)
        self.framed = frozenset(n for n in self.cached if fold_cache.is_framed(self.projections[n]))
        # those whose complete frames are chunk caches, written as the appends complete
        # them (looked for every FRAME_LOOK bytes of log)
        self.chunked = frozenset(
            n for n in self.framed if fold_cache.chunks_kept(self.engine, self.projections[n])
        )
        # what `after_write` looks at, settled here rather than on every append: the
        # states a writer keeps current (not framed), each with its `cache_every` (0: by
        # bytes only)
        self.writing: dict[str, int] = {}
        if self.tuning.cache_while_writing:
            for n in self.cached:
                if n not in self.framed:
                    every = getattr(self.projections[n], "cache_every", 0)
                    self.writing[n] = every if type(every) is int and every > 0 else 0
        self.after_writes = bool(self.writing or self.chunked)

    def reset_after_fork(self) -> None:
        self.kept_bytes = 0

    def first_fold(self, sess: SessionState, proj: Projection[Any], start: bool = True) -> Fold:
        """Where this process starts folding a projection: the engine's fold cache when
        it keeps one that checks, else the beginning. Where caches are kept, the cache,
        else the checked prefix and the log from its start, are asked for together
        (`CachingEngine.open_cold`: one round trip where the engine can). `start`
        False: the cache alone (no fold from the start follows)."""
        name = proj.name if proj.name in self.cached else None
        p = sess.prefix
        mark = checked_prefix.NAME if p is None or not p.size else None  # (else kept here)
        if not self.marks or (name is None and (mark is None or not start)):
            return Fold(proj.initial(), EMPTY_HEAD)
        engine = cast(CachingEngine, self.engine)
        if not start:
            opened = engine.open_cache(sess.session_id, proj.name)
            return self._cached(sess, proj, opened) or Fold(proj.initial(), EMPTY_HEAD)
        cold = engine.open_cold(sess.session_id, name, mark)
        if cold.cache is not None:
            return self._cached(sess, proj, cold.cache) or Fold(proj.initial(), EMPTY_HEAD)
        f = Fold(proj.initial(), EMPTY_HEAD)
        f.read_on, f.cold = cold.read_on, cold
        return f

    def _cached(
        self, sess: SessionState, proj: Projection[Any], opened: tuple[Head, CacheReader] | None
    ) -> Fold | None:
        """The fold of `proj`'s cache as the engine `opened` it, if it checks
        (`fold_cache.load_opened`)."""
        found = fold_cache.load_opened(
            cast(CachingEngine, self.engine), opened, sess.session_id, proj,
            self.cached[proj.name], self.mac, self.crypt,
        )  # fmt: skip
        if found is None:
            return None
        f = Fold(found[0], found[1], found[1], found[2])
        f.read_on = found[3]
        return f

    def start_mark(self, sess: SessionState, f: Fold) -> checked_prefix.Mark | None:
        """The checked prefix the fold `f` from the start of the log may trust, if any:
        the one its cold start found (taken once), else asked for with the log from its
        start (`open_cold`: a fold kept at an empty log reads both in one round trip
        where the engine can; the read is the fold's, which follows at once)."""
        cold, f.cold = f.cold, None
        if not self.marks:
            return None
        p = sess.prefix
        if p is not None and p.size:
            return p.mark()
        if cold is None:
            engine = cast(CachingEngine, self.engine)
            cold = engine.open_cold(sess.session_id, None, checked_prefix.NAME)
            if f.read_on is None:
                f.read_on = cold.read_on
        return checked_prefix.parse(cold.mark, sess.session_id, self.mac)

    def after_fold(self, sess: SessionState, proj: Projection[Any], f: Fold, folded: int) -> None:
        """Save what a fold of `folded` bytes made worth saving (a load never pays for
        writing a large framed state)."""
        if (
            folded >= self.tuning.cache_after_fold
            and proj.name in self.cached
            and proj.name not in self.framed
        ):
            self.save_fold(sess.session_id, proj.name, f.state, f.head)
            f.saved = f.head
        p = sess.prefix
        if p is not None and p.head is f.head and p.size - p.saved >= self.tuning.cache_after_fold:
            checked_prefix.store(self.engine, sess.session_id, p, self.mac)

    def save_fold(
        self, session_id: str, name: str, state: Any, head: Head, f: Fold | None = None
    ) -> int:
        """Keep projection `name`'s `state` at `head` in the fold cache, marked with the
        event types this store decodes of those it reads; the bytes that took. With `f`
        (whose state it is): the chunk caches `f` holds are not written again, and `f`
        keeps those written."""
        proj = self.projections[name]
        chunks = None
        if f is not None and name in self.chunked:
            chunks = f.chunks = fold_cache.chunks_of(f.chunks, state)
        return fold_cache.store(
            self.engine, session_id, proj, state, head, self.cached[name], self.mac,
            self.crypt, chunks,
        )  # fmt: skip

    def after_write(self, sess: SessionState) -> None:
        """After a write's batch is committed (and flushed as asked), with the session's
        lock held: keep a writer's caches current (`keep_current`), and keep the next
        complete frame of each state kept in chunks (the transcript's) as a chunk cache,
        so that close writes only the last frame (`fold_cache.store_complete_frames`).
        Only where `after_writes`. It runs after every append: what a look found not due
        is remembered (`Fold.due`, `Chunks.looked`), and most appends cost a comparison."""
        folds = sess.folds
        for name, events in self.writing.items():
            f = folds.get(name)
            if f is None:
                continue
            head, due = f.head, f.due
            # the last look's answer while it holds (the same saved head, the size and
            # seq within what it found not due)
            if (
                due is None
                or due[0] is not f.saved
                or not due[1] <= head.size < due[2]
                or head.seq >= due[3]
            ):
                self.keep_current(sess.session_id, name, f, events)
        for name in self.chunked:
            f = folds.get(name)
            if f is None:
                continue
            chunks, size = f.chunks, f.head.size
            if chunks is None or not chunks.of(f.state):
                chunks = f.chunks = fold_cache.Chunks(f.state)
            elif chunks.looked <= size < chunks.looked + FRAME_LOOK:
                continue  # looked a moment ago (a frame is hundreds of messages)
            chunks.looked = size
            fold_cache.store_complete_frames(
                cast(CachingEngine, self.engine),  # (`chunked` only where it keeps caches)
                sess.session_id, self.projections[name], chunks, f.head,
                self.cached[name], self.mac, self.crypt,
            )  # fmt: skip

    def keep_current(self, session_id: str, name: str, f: Fold, events: int) -> None:
        """Keep the fold cache of a writer's state `f` (of projection `name`) current as
        it appends, so that a cold load in another process (while this one runs, or after
        it was killed before any close) folds at most about `Tuning.cache_while_writing`
        bytes of log, or eight times the state's own size, past the cache. A framed state
        (a transcript's, about the log's size) is left to close and compaction. A
        projection whose events each cost a fold about its state's size (LangGraph's
        head: a delta rebuilds a whole blob) says `cache_every = N` (`events`): saved
        after N events too, however few bytes they hold. What it finds not yet due is
        kept in `f.due` for `after_write`."""
        head, old = f.head, f.saved
        if head.position is None:
            return
        if old is not None and old.size <= head.size:
            saved, saved_seq, cap = old.size, old.seq, _NEVER
        else:
            # never saved, or a log now shorter than the saved head (another store
            # compacted it): judged from nothing, until the log is that long again
            saved = saved_seq = 0
            cap = _NEVER if old is None else old.size
        # eight times the state's size: saving costs about that (encoding it whole), so
        # what the saves add stays within an eighth of what the appends cost
        size_due = saved + max(self.tuning.cache_while_writing, 8 * f.saved_bytes)
        seq_due = saved_seq + events if events else _NEVER
        if head.size >= size_due or head.seq >= seq_due:
            f.saved_bytes = self.save_fold(session_id, name, f.state, head)
            f.saved, f.due = head, None
        else:
            f.due = (old, saved, min(size_due, cap), seq_due)

    def save_fold_caches(self, session_id: str, head: Head, states: dict[str, Any]) -> None:
        """Keep folded `states` (by projection name, at `head`) in the fold cache, for
        the projections it keeps (compaction's states of the snapshot it installed)."""
        for name, state in states.items():
            if name in self.cached:
                self.save_fold(session_id, name, state, head)

    def worth_saving(self, name: str, f: Fold) -> bool:
        """Whether the fold cache of projection `name` should now hold `f`: it holds an
        older head, and the log is not too short to gain from a cache. A framed state
        (a transcript's) costs about the log's size to write, so it is rewritten only
        once the log has grown by an eighth since the head it holds, unless its complete
        frames are chunk caches already (`Fold.chunks`): then only the rest is written."""
        if name not in self.cached or f.head.size < self.tuning.cache_on_close:
            return False
        saved = f.saved
        if saved is None:
            return True
        if saved.seq == f.head.seq:
            return False
        chunked = f.chunks is not None and f.chunks.of(f.state)
        if name in self.framed and not chunked and f.head.size >= saved.size:
            return (f.head.size - saved.size) * 8 >= saved.size
        return True

    def save_caches(self, sess: SessionState) -> None:
        """Save what is worth saving of a session the core stops keeping: the fold
        caches that would hold something new, and the checked prefix."""
        self.release(sess)
        if sess.lock._is_owned():  # type: ignore[attr-defined]
            # this thread is folding into it (a load nested in a projection's fold
            # evicted it): its states may be half folded, its prefix unproven
            return
        with sess.lock:
            for name, f in sess.folds.items():
                if self.worth_saving(name, f):
                    self.save_fold(sess.session_id, name, f.state, f.head, f)
            p = sess.prefix
            if p is not None and p.size != p.saved and p.size >= self.tuning.cache_on_close:
                checked_prefix.store(self.engine, sess.session_id, p, self.mac)

    def release(self, sess: SessionState) -> None:
        """Give back what the session held of the creation budget (it is dropped or
        forgotten: what it kept from its creation goes with it)."""
        if sess.kept_from_creation > 0:
            self.kept_bytes -= sess.kept_from_creation
        sess.kept_from_creation = -1

    def keep_from_creation(self, sess: SessionState, head: Head) -> None:
        """The session is being created by this store: start, at its empty head, the
        built-in states the fold cache keeps that it has not (the transcript, unless the
        caller loaded it), so that what it appends is folded as it goes and close saves
        their caches: the next process's cold load then reads those, not the log. Within
        a budget (`Tuning.kept_from_creation` bytes of log a store), past which a
        session's kept transcript is let go (an importer of many sessions)."""
        if self.kept_bytes >= self.tuning.kept_from_creation:
            return
        started = False
        for name in self.cached:
            if name in self.builtin and name not in sess.folds:
                sess.folds[name] = Fold(self.projections[name].initial(), head)
                started = True
        if started:
            sess.kept_from_creation = 0

    def count_kept(self, sess: SessionState, n: int) -> None:
        """`n` more bytes folded into the states kept from the session's creation; past
        the store's budget, its transcript (the large one) is let go."""
        sess.kept_from_creation += n
        self.kept_bytes += n
        if self.kept_bytes > self.tuning.kept_from_creation:
            f = sess.folds.get("transcript")
            if f is not None and f.saved is None:
                del sess.folds["transcript"]
            self.kept_bytes -= sess.kept_from_creation
            sess.kept_from_creation = -1

    def vouch_for_snapshot(self, sess: SessionState, line: bytes, head: Head) -> None:
        """The checked prefix of a log a compaction just made of one snapshot `line`
        (bytes this store encoded and chained itself), kept for cold loads: the first
        load after it need not check a long line's hash."""
        if not self.marks or head.size != len(line):
            return
        p = checked_prefix.Prefix()
        p.extend(line, head)
        with sess.lock:
            if sess.prefix is not None or sess.head is not head:
                return  # a load or an append got there first
            sess.prefix = p
        checked_prefix.store(self.engine, sess.session_id, p, self.mac)
