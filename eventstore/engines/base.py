"""The storage engine interface: everything an engine must do for the face, and nothing else.

An engine stores, per session, an ordered log of *lines*: the exact bytes the face
encoded (one JSON object each, ending in a newline), plus, for compacted sessions, the
history those lines replaced. An engine knows bytes and line *envelopes* (`seq`, the
batch marker `more`, the hash `h`, a snapshot's `base_h`; see `eventstore.format.events`), never
records, projections or folds. Everything a user sees (the codec and hash chain, folding
and its caches, compaction's fold and snapshot building, retention, history reads,
`state_at`, verify, follow, stats, export and repair's decisions) is written once, above
this interface, in the face (`eventstore.store` and the modules it uses).

Engines are chosen by URL (`open_engine`):

    /some/dir, ./rel, file:///abs/dir     the file engine (eventstore.engines.file)
    memory://                             a private in-memory engine
    memory://NAME                         an in-memory engine shared by NAME in this process
    postgresql://... / postgres://...     eventstore.engines.postgres (imported on use)
    redis://... / rediss://... / unix://  eventstore.engines.redis (imported on use)

The contract, in the order the face uses it:

Reading. `read(sid, position)` returns the committed lines after an opaque `Position`
(None: the beginning) and the `Head` after them, whose `position` is where the next
read starts. Committed means complete batches only: a torn tail (a partial line, or a
batch whose closing line is missing, after a crash) is never returned. If the log was
replaced since `position` was taken (a snapshot was installed, the session was removed
or repaired), the result has `reset=True` and its lines start at the beginning of the
current log (typically with a snapshot line). A position never names a byte offset or
a file to the face; only the engine that made it may interpret it.

Appending. The face reads up to the head, validates a command against the state it
folded, encodes the batch chained to that head (`seq` = head.seq + 1.., the first `h`
linked to `head.link`) and calls `append(sid, batch, expected=head)`. Under the writers'
exclusion (across threads and processes sharing the store) the engine compares the
session's current (seq, link) with `expected`; if they differ it writes nothing and
raises `HeadMovedError` carrying the actual head; the face then catches up, re-validates,
re-encodes and retries. Otherwise it makes the whole batch durable as one unit (all or
nothing after a crash) and returns the new head. This is one round trip for a database
(one statement or server-side function) and it is what makes
`initialize_session_if_missing` have exactly one winner: the losers' expected head is
stale, so they re-validate and find the manifest.

Installing a snapshot changes neither the head's `seq` nor its `link` (a snapshot's link
is its `base_h`, the `h` of the last line it covers), so appends encoded before a
compaction stay valid after it.

Idempotency. The face is the authority: it checks an idempotency key against its own
projection after catching up, and the expected-head check makes that race-free (any
concurrent append moves the head, so the loser re-checks and finds the key). The batch
carries the key and a fingerprint of the request so that an engine MAY store them (a
table in a database, for lookups beyond what the face's projection keeps); an engine
never refuses or replays a batch because of its key.

Snapshots. `install_snapshot(sid, line, covers, keep_history)` replaces the live log by
one snapshot line that covers every line up to `covers` (the head the face folded),
followed verbatim by whatever lines were committed after `covers` meanwhile (they chain
to the snapshot's `base_h`, so the chain holds). It is atomic: at every instant, and after
a crash at any point, the session has exactly one complete log, the old or the new. With
`keep_history` the lines the snapshot replaced (up to `covers`) stay readable through
`history`, each once; without, they are gone. If `covers` is no longer in the live log
(another snapshot was installed, the session was removed or repaired), nothing changes
and `HeadMovedError` is raised.

History. `history(sid)` returns one consistent picture of everything the engine still
holds for a session: the kept segments oldest first, then the live log, each as raw bytes
(torn tails included: verify reports them) with a name for messages. Consistent means
as of one instant: no segment is missing or doubled because a compaction ran while it
was read. Segments may overlap (a snapshot's later lines are copies); the face reads
each sequence number once.

There is no "read only one projection's part of a snapshot" hint: a load checks every
line's `h`, which covers the whole snapshot line, so an engine always returns it whole
(the face then decodes only the part it folds).

Waiting. `wait(sid, position, timeout)` blocks until lines may have been committed after
`position` (or the log was replaced), or `timeout` seconds pass; the caller always re-reads.

Sessions. `list_sessions()` gives the ids of every session with at least one committed
line; `remove_session(sid)` removes a session's log, history and anything else kept for
it atomically (no reader ever sees it half-removed) and is safe beside live writers (an
append racing a removal either lands before it and is removed with it, or sees an empty
session and raises `HeadMovedError`).

Capabilities (optional). What an engine can do beyond this contract it says in one way:
by the capability interfaces below it subclasses, and callers ask `isinstance`:

    CachingEngine   open_cache/load_cache/store_cache: a folded state kept beside a
                    session, given back only while its head is still in the live log
                    (open_cache_parts: a cache's parts, which need no live-log check)
    RangedEngine    live_view: byte ranges of the live log (transcript paging from the end)
    SeqEngine       lines_at: lines of the live log by their seqs (an index of lines)
    PruningEngine   prune_history: kept segments removed for good
    FeedEngine      feed: every session's lines in one global order (PostgreSQL)
    IndexingEngine  index_page/replace_index: a session index kept as the engine writes
                    (`IndexEntry`: times, seq, size, labels), paged without a scan

An engine without one simply does not subclass it; nothing above the engines calls a
capability's methods on an engine that does not declare it.

Repair. `hold(sid)` takes the writers' exclusion for an explicit repair and gives the raw
live log, torn tail included; the face decides what to keep, and `RepairHold.keep_prefix`
replaces the live log by a prefix of it (`RepairHold.rewrite`: by lines the face
rebuilt) atomically, saving the whole original aside first: recovery never destroys a
committed byte.

Threads and processes. Every method is safe to call from several threads; an engine whose
storage is shared across processes (file, database) excludes writers across them. Locks
and descriptors held per process are reset in a forked child (`eventstore.process`:
`track` an object with `reset_after_fork`, or register a function with `at_fork`).

Names. Segment and archive names (`Segment.where`, `InstallResult.archived`,
`PrunedSegment.where`) are strings the engine makes: a path for the file engine, a
URL-like name (`memory://x/s/archive/...`, `postgresql://...#s@1`) for the others. Only
an engine that keeps files also gives a `Path` (`Segment.path`,
`InstallResult.archived_path`); elsewhere they are None.

Adding an engine: subclass `Engine` (and the capability interfaces it implements), add a
module with a `from_url(url, **options) -> Engine` function and its scheme in `SCHEMES`
(the one registry of engines; every engine takes the options `durability` and `create`,
ignoring those it has no use for), and run the conformance suite that ships with the package:
subclass `eventstore.engines.conformance.EngineConformance` in your tests (its docstring
says how).
"""

from __future__ import annotations

import importlib
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Literal, Protocol
from urllib.parse import parse_qsl, urlencode

import msgspec

from eventstore.errors import (
    CorruptLogError,
    EventStoreError,
    InvalidArgumentError,
    UnknownEngineError,
    UnsupportedError,
)

__all__ = [
    "EMPTY_HEAD",
    "head_disputed",
    "READ_AHEAD",
    "SCHEMES",
    "BytesCacheReader",
    "BytesSegment",
    "CacheReader",
    "CachingEngine",
    "ColdStart",
    "Durability",
    "EncodedBatch",
    "Engine",
    "FeedEngine",
    "FeedItem",
    "Head",
    "HeadMovedError",
    "History",
    "IndexEntry",
    "IndexOrder",
    "IndexingEngine",
    "InstallResult",
    "LiveView",
    "PrunedSegment",
    "PruningEngine",
    "RangedEngine",
    "UnsupportedError",
    "Position",
    "ReadResult",
    "RepairHold",
    "Segment",
    "SeqEngine",
    "SeqLine",
    "UnknownEngineError",
    "UnreadableSegment",
    "WriterTurn",
    "cache_part_name",
    "index_after",
    "index_appended",
    "index_matches",
    "index_moved",
    "is_conninfo",
    "open_engine",
    "read_whole",
    "redact_conninfo",
    "redact_text",
    "redact_url",
    "scheme_of",
    "split_userinfo",
]

Durability = Literal["flush", "fsync"]
"""What an append survives: "flush" (reaches the OS: a killed process) or "fsync" (power
loss). Engines with their own durability settings (a database) may ignore it."""


class Position:
    """An opaque read position made by an engine; only that engine interprets it.

    Positions compare equal when they name the same place in the same log, which is all
    the face relies on (a cached fold is current when its position equals the head's).
    Engines subclass it as a frozen msgspec Struct. None, where a position is accepted,
    means the beginning of the log.
    """

    __slots__ = ()


class Head(msgspec.Struct, frozen=True):
    """The last committed line of a session's live log, and where reading ends.

    `seq`: its sequence number (0: the session has no line). `link`: what the next line
    chains to (its `h`, or a snapshot's `base_h`; "" for an empty session). `h`: the
    line's own hash ("" when empty). `position`: just after it (None when empty).
    `size`: bytes of committed lines in the live log. `base_seq`: the `seq` of the live
    log's first line (a snapshot's seq after compaction, 1 before; 0 when empty), so the
    live log holds `seq - base_seq + 1` lines: what automatic compaction measures.
    """

    seq: int = 0
    link: str = ""
    h: str = ""
    position: Position | None = None
    size: int = 0
    base_seq: int = 0

    def same_chain_point(self, other: Head) -> bool:
        """Whether an append encoded against `other` chains onto this head."""
        return self.seq == other.seq and self.link == other.link


EMPTY_HEAD = Head()


class HeadMovedError(EventStoreError):
    """An engine refused a write because the session's head is not the one expected.

    Raised by `Engine.append` and `Engine.install_snapshot`; nothing was written. `actual`
    is the head found. The face catches it, catches up, re-validates and retries; users of
    the session API never see it (an explicit `expected_seq` mismatch is reported as
    `ConcurrencyError`).
    """

    def __init__(self, where: str, expected: Head, actual: Head) -> None:
        super().__init__(
            f"{where}: the head moved: expected seq {expected.seq} (link {expected.link or '-'}),"
            f" found seq {actual.seq} (link {actual.link or '-'})"
        )
        self.where = where
        self.expected = expected
        self.actual = actual


class EncodedBatch(msgspec.Struct, frozen=True):
    """One batch of lines, encoded and chained by the face, written by an engine as a unit.

    `data`: the lines, each ending in a newline, exactly as they must be stored.
    `first_seq`..`last_seq`: their sequence numbers (contiguous). `hashes`: each line's
    `h`, in order. `link`: what the line after the batch will chain to. `key` and
    `fingerprint`: the idempotency key the batch was appended with (on its first line)
    and a digest of the request; an engine may store them, never acts on them. `ts_us`:
    the time the face stamped on the batch's lines (microseconds since the epoch, 0:
    unknown) and `labels`: the session's labels when the batch sets them (None: it does
    not): what an `IndexingEngine` keeps in its index. A frozen msgspec Struct, like
    `Head`: every append builds one.
    """

    data: bytes
    first_seq: int
    last_seq: int
    hashes: tuple[str, ...]
    link: str
    key: str | None = None
    fingerprint: str | None = None
    ts_us: int = 0
    labels: dict[str, str] | None = None

    def lines(self) -> list[bytes]:
        """The lines without their newlines (for engines that store one row per line)."""
        return self.data.split(b"\n")[:-1]


class ReadResult(msgspec.Struct, frozen=True):
    """What `Engine.read` returns.

    `data`: complete committed lines after the position read from (each ending in a
    newline; possibly empty): bytes from `read`; from `read_some`, possibly a memoryview
    of a larger buffer (a piece cut at its last whole batch, not copied). `head`: the
    head after them; `head.position` is where the next read starts. `reset`: the log
    was replaced since the position was taken, and `data` starts at the beginning of the
    current log. `where` and `offset` locate `data[0]` for error messages: a name (a
    path, or a URL-like name) and the byte offset of the first byte of `data` within the
    session's live log.
    """

    data: bytes | memoryview
    head: Head
    reset: bool
    where: str
    offset: int = 0


READ_AHEAD = 256
"""How far past a fold cache's head (in lines, or batches where the engine keeps
batches) an engine's `open_cache` reads on with it (`CacheReader.read_on`): a writer
keeps its caches closer than this; past it, the fold reads on its own."""


class CacheReader(ABC):
    """The bytes of a kept cache, read front to back: a cache can be tens of megabytes
    (a long transcript's), and a load reads it a part at a time so that it never holds
    it all at once. `size`: how many bytes it has. A context manager (`close`).

    `read_on`: the live log after the cache's head, read in the same round trip as the
    cache (`read(session, head.position)` as of then), by an engine that can; the fold
    that starts from the cache at once takes it instead of reading. None: it reads."""

    size: int
    read_on: ReadResult | None = None

    @abstractmethod
    def read(self, n: int) -> bytes:
        """The next `n` bytes (fewer only at the end)."""

    def close(self) -> None:  # noqa: B027 - optional: a reader over memory holds nothing
        """Release what it holds (a descriptor). Idempotent."""

    def __enter__(self) -> CacheReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class BytesCacheReader(CacheReader):
    """A `CacheReader` over bytes already in memory."""

    def __init__(self, data: bytes) -> None:
        self.size = len(data)
        self._data = memoryview(data)
        self._at = 0

    def read(self, n: int) -> bytes:
        """The next `n` bytes (fewer only at the end)."""
        part = self._data[self._at : self._at + n]
        self._at += len(part)
        return bytes(part)


class Segment(ABC):
    """One piece of a session's history as of the instant `history` was taken.

    `archived`: True for a kept (replaced) segment, False for the live log. `where`: its
    engine-neutral name (a path for the file engine, a URL-like name elsewhere). `path`:
    the file holding it, for an engine that keeps files (None elsewhere). `size`: its
    length in bytes as of that instant. `first_seq`/`last_seq`: what the engine recorded
    the segment as holding (None when it records nothing; verify checks them against the
    contents).
    """

    archived: bool
    where: str
    size: int
    first_seq: int | None = None
    last_seq: int | None = None
    path: Path | None = None

    @abstractmethod
    def read(self) -> bytes:
        """Its raw bytes as of the instant the history was taken (`size` of them), torn
        tail included; valid until the history is closed."""


class BytesSegment(Segment):
    """A `Segment` over bytes already in memory (what the memory and PostgreSQL engines
    copy out of their storage when a history is taken)."""

    def __init__(
        self,
        data: bytes,
        where: str,
        archived: bool,
        first_seq: int | None = None,
        last_seq: int | None = None,
    ) -> None:
        self._data = data
        self.where = where
        self.size = len(data)
        self.archived = archived
        self.first_seq = first_seq
        self.last_seq = last_seq

    def read(self) -> bytes:
        """The bytes it was made with."""
        return self._data


class UnreadableSegment(BytesSegment):
    """A live log a history found unreadable (its rows or list do not reach the head it
    was read with, edited from outside): reading it raises `error`, as a read of the log
    does, so `verify` reports it and no export or copy takes the rest for the whole log."""

    def __init__(self, data: bytes, where: str, error: EventStoreError) -> None:
        super().__init__(data, where, False)
        self.error = error

    def read(self) -> bytes:
        """Raise the error the history found."""
        raise self.error


class History:
    """A session's whole history as one consistent picture: `segments` are the archived
    segments oldest first, then the live log (absent if the session has none).

    A context manager: engines may hold resources (descriptors, a transaction) until it
    is closed, which is what keeps the picture consistent while segments are read.
    """

    def __init__(self, segments: list[Segment]) -> None:
        self.segments = segments

    @property
    def live(self) -> Segment | None:
        """The live log's segment, if the session has one."""
        if self.segments and not self.segments[-1].archived:
            return self.segments[-1]
        return None

    def __iter__(self) -> Iterator[Segment]:
        return iter(self.segments)

    def close(self) -> None:
        """Release what the engine holds for this picture (nothing by default)."""

    def __enter__(self) -> History:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class InstallResult(msgspec.Struct, frozen=True):
    """What `install_snapshot` did: the new `head` (same seq and link as before), the
    `archived` segment's name if the replaced lines were kept (and `archived_path`, the
    file, from an engine that keeps files), the bytes of the live log `before` and
    `after` the swap."""

    head: Head
    archived: str | None
    before: int
    after: int
    archived_path: Path | None = None


class LiveView(msgspec.Struct, frozen=True):
    """One consistent picture of a session's live log for reading parts of it (what
    transcript paging reads from the end). `head`: its last committed line (`head.size`
    committed bytes); `read_span(start, end)`: bytes [start, end) of that same log, for
    `end <= head.size`, valid until the view is closed; `where` names it for messages."""

    head: Head
    read_span: Callable[[int, int], bytes]
    where: str


class PrunedSegment(msgspec.Struct, frozen=True):
    """An archived segment `prune_history` removed: its name and the lines it held."""

    where: str
    first_seq: int
    last_seq: int
    size: int


def head_disputed(where: str, seq: int | None, why: str) -> CorruptLogError:
    """What a `RepairHold` raises for a live log its head disagrees with (`why`) where
    it cannot tell which of the two is right: nothing is changed."""
    return CorruptLogError(
        where, 0, seq,
        f"{why}; repair cannot tell whether the head or the log is right and changes"
        " nothing: restore the session from a backup, or purge it"
        " (delete_session(purge=True), `eventstore delete --purge`)",
    )  # fmt: skip


class RepairHold(ABC):
    """The writers' exclusion held for an explicit repair (see `Engine.hold`)."""

    where: str
    """The live log's name for messages."""

    @property
    @abstractmethod
    def data(self) -> bytes:
        """Every byte of the live log, torn tail included (b"" when it has none)."""

    @property
    def head_end(self) -> int | None:
        """Where the engine's own record of the log's end (a head kept apart from the
        bytes) says the committed bytes end, when that is before the end of `data`:
        what follows was written past the head from outside the store, never by an
        append (Redis: batches its head does not count; PostgreSQL: line rows past its
        head's seq). None (the default): the bytes are the whole log."""
        return None

    @abstractmethod
    def keep_prefix(self, n: int, reason: str) -> str | None:
        """Replace the live log by its first `n` bytes (a line boundary), atomically.

        Every byte dropped is saved aside first (the whole original, under a name
        containing `reason`, e.g. "torn" or "corrupt"); returns the name it was saved
        under, or None when `n` is the whole log (nothing changes).
        """

    @abstractmethod
    def rewrite(self, data: bytes, reason: str) -> str:
        """Replace the live log by `data` (lines a repair rebuilt), atomically, saving
        the whole original aside first under a name containing `reason`; returns that
        name. The new live log is `data` as given: its head is its last complete batch
        (a partial last line or batch of `data` reads as a torn tail), which is also how
        a test plants a damaged log (`eventstore.engines.conformance.corrupt`)."""


class WriterTurn:
    """One writer's turn at appending to a session, taken around the caller's own
    exclusion of the session's writers (the store's session lock):

        with engine.turn(session_id) as turn:   # the writer queues
            with session_lock:
                turn.start()                    # it holds the lock now
                try:
                    head = turn.append(batch, expected)   # as `engine.append`
                finally:
                    if turn.finish():           # before the lock is released
                        ...                     # forget what was folded of the session
        # past the `with`: the append is as durable as the engine's durability says

    An engine with group commit (the file engine with `durability="fsync"`) lets a
    writer with others queued behind it leave its flush to them, and `__exit__` waits
    for the flush that covers it (StorageError if it failed). This base is plain
    `engine.append` and no waiting; an engine with no flush to share gives no turn
    (`Engine.turn` returns None) and the writer calls `append` itself."""

    __slots__ = ("engine", "session_id")

    def __init__(self, engine: Engine, session_id: str) -> None:
        self.engine = engine
        self.session_id = session_id

    def __enter__(self) -> WriterTurn:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        return None

    def start(self) -> None:
        """The writer holds the session's lock now."""

    def append(self, batch: EncodedBatch, expected: Head) -> Head:
        """`Engine.append` within this turn."""
        return self.engine.append(self.session_id, batch, expected)

    def finish(self) -> bool:
        """The writer is about to release the session's lock (whatever happened). True
        when it committed appends staged by other writers and that failed: what the
        caller folded of the session may hold batches that were never stored."""
        return False


class Engine(ABC):
    """A storage engine: see the module docstring for the contract every method keeps.

    `url` names the store (a password, if any, redacted): for messages and for opening
    the same store again.
    """

    url: str

    # -- reading ----------------------------------------------------------------------

    @abstractmethod
    def read(self, session_id: str, position: Position | None) -> ReadResult:
        """The committed lines after `position` (None: from the beginning)."""

    def read_some(
        self, session_id: str, position: Position | None, limit: int
    ) -> tuple[ReadResult, bool]:
        """`read`, in pieces: an engine MAY stop after the last complete batch within
        about `limit` bytes (never before the first batch) and return True with it; the
        caller then reads on from the result's head. A load folds a long log piece by
        piece this way, so it never holds the whole log in memory. The default reads
        everything at once (False)."""
        return self.read(session_id, position), False

    @abstractmethod
    def head(self, session_id: str) -> Head:
        """The session's head, cheaply (from the tail of the log alone)."""

    @abstractmethod
    def history(self, session_id: str) -> History:
        """The archived segments then the live log, as of one instant (close it when
        done: use it as a context manager)."""

    @abstractmethod
    def wait(self, session_id: str, position: Position | None, timeout: float) -> bool:
        """Block until lines may have been committed after `position` or the log was
        replaced (True), or `timeout` seconds passed (False). Spurious True is allowed."""

    # -- writing ----------------------------------------------------------------------

    @abstractmethod
    def append(self, session_id: str, batch: EncodedBatch, expected: Head) -> Head:
        """Write `batch` atomically if the session's head is still `expected`
        (compared by seq and link), else raise HeadMovedError; returns the new head."""

    def turn(self, session_id: str) -> WriterTurn | None:
        """A writer's turn at appending to the session (see `WriterTurn`), for engines
        whose durable appends can share one flush (group commit); None (this default):
        no turn to take, the writer calls `append` under its own lock."""
        return None

    @abstractmethod
    def install_snapshot(
        self, session_id: str, line: bytes, covers: Head, *, keep_history: bool
    ) -> InstallResult:
        """Replace the live log by `line` (one snapshot line, newline-terminated) plus
        the lines committed after `covers`, atomically; HeadMovedError if `covers` is no
        longer in the live log."""

    @abstractmethod
    def hold(self, session_id: str) -> AbstractContextManager[RepairHold]:
        """Hold the writers' exclusion for a repair; see `RepairHold`."""

    # -- sessions ---------------------------------------------------------------------

    @property
    def supports_pruning(self) -> bool:
        """Whether this engine is a `PruningEngine` (kept for callers of earlier releases:
        ask `isinstance(engine, PruningEngine)`)."""
        return isinstance(self, PruningEngine)

    @abstractmethod
    def list_sessions(self) -> list[str]:
        """The ids of every session with a committed line (live or archived), sorted."""

    @abstractmethod
    def remove_session(self, session_id: str) -> bool:
        """Remove the session and all it keeps, atomically; False if it did not exist."""

    def let_go(self, session_id: str) -> None:  # noqa: B027 - optional, as documented
        """The store no longer keeps the session in memory (its `cached_sessions` bound
        dropped it): the engine may free what it keeps of the session in this process.
        Nothing freed may be needed for correctness: the next use of the session starts
        as a first one. The default keeps nothing per session, so frees nothing."""

    @abstractmethod
    def close(self) -> None:
        """Release what the engine holds (descriptors, connections). Idempotent."""

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- capabilities -------------------------------------------------------------------------


class CachingEngine(Engine):
    """An engine that keeps a folded state beside a session (the face's fold caches and
    checked prefixes: `eventstore.core.fold_cache`, `eventstore.core.checked_prefix`)."""

    @abstractmethod
    def open_cache(self, session_id: str, name: str) -> tuple[Head, CacheReader] | None:
        """A reader of the bytes last given to `store_cache` under `name` for the session
        and the head they were stored with, if that head is still a point of the live
        log (same log, the same `h` at its position); else None. The face checks the
        bytes themselves (`eventstore.core.fold_cache`)."""

    def load_cache(self, session_id: str, name: str) -> tuple[Head, bytes] | None:
        """`open_cache`, read whole (for the small caches)."""
        return read_whole(self.open_cache(session_id, name))

    @abstractmethod
    def store_cache(self, session_id: str, name: str, head: Head, data: list[bytes]) -> None:
        """Keep the bytes of `data` (a folded state at `head`, in pieces: a long state is
        never joined into one copy) under `name` for the session, replacing what was
        kept, atomically; nothing when the session has no log. Removed with the session."""

    def open_cold(self, session_id: str, name: str | None, mark: str | None) -> ColdStart:
        """Where a fold that has nothing in this process starts, read together: the
        cache `name` (None: none is kept for this fold) as `open_cache` gives it; when
        there is none, the cache `mark` (None: not needed) as `load_cache` gives it (the
        checked prefix a fold from the start may trust) and, from an engine that can,
        the live log from its start as `read(session, None)` gives it then, when it
        holds at most `READ_AHEAD` lines or batches (the fold from the start takes it
        instead of reading). By default `open_cache`, then `load_cache`: a round trip
        each; an engine overrides it to read them in fewer (Redis: one script)."""
        found = None if name is None else self.open_cache(session_id, name)
        if found is not None:
            return ColdStart(found)
        return ColdStart(None, None if mark is None else self.load_cache(session_id, mark))

    keeps_cache_parts = False
    """Whether `remove_cache_parts` removes them: only then does the face keep a long
    state's cache in parts (`eventstore.core.fold_cache`: chunk caches, one complete
    frame each, written once), which it must be able to remove when a state that
    dropped their content replaces it (a compaction's retention, a delete's erase)."""

    def remove_cache_parts(self, session_id: str, name: str, start: int) -> None:  # noqa: B027
        """Remove the caches kept under `name#k` for every k >= `start` (the parts of
        the cache `name` past the first `start`). Engines with `keeps_cache_parts`."""

    def open_cache_parts(
        self, session_id: str, name: str, count: int
    ) -> Iterator[tuple[Head, CacheReader] | None]:
        """The parts `name#0` .. `name#<count - 1>` of the session's cache, in order,
        each as `open_cache` gives it (None: none kept), except that the engine need not
        check again that the part's head is a point of the live log: the face opens
        parts only as the cache `name`, which `open_cache` found live, lists them, each
        at a head and with a checksum that cache names (`eventstore.core.fold_cache`),
        so the check would cost a log read per part for nothing. Everything else that
        makes a part's bytes safe to read is still the engine's (the file engine: no
        link followed, a regular file of bounded size, its own line). The head given
        back names the part's seq, link and `h`; its position is for comparing only,
        never for reading from. A lazy iterator the caller may stop early; each reader
        is the caller's to close. By default `open_cache` for each part (which checks
        more); an engine overrides it to open them cheaper (PostgreSQL: one query)."""
        for k in range(count):
            yield self.open_cache(session_id, cache_part_name(name, k))


class ColdStart(msgspec.Struct, frozen=True):
    """What `CachingEngine.open_cold` found: the cache (`open_cache`'s answer), else the
    mark (`load_cache`'s) and possibly the read of the live log from its start
    (`read_on`; None: the fold reads)."""

    cache: tuple[Head, CacheReader] | None
    mark: tuple[Head, bytes] | None = None
    read_on: ReadResult | None = None


def read_whole(found: tuple[Head, CacheReader] | None) -> tuple[Head, bytes] | None:
    """An opened cache (`open_cache`'s answer) with its bytes read whole and its reader
    closed, as `load_cache` gives it."""
    if found is None:
        return None
    head, reader = found
    with reader:
        return head, reader.read(reader.size)


def cache_part_name(name: str, k: int) -> str:
    """The name of part `k` of the cache `name` (`CachingEngine.remove_cache_parts`,
    `CachingEngine.open_cache_parts`)."""
    return f"{name}#{k}"


class KeyEngine(Engine):
    """An engine that keeps key slots: per encrypted session, its data key wrapped by
    master keys (`eventstore.format.crypt.KeySlot`), under the data key's id. A slot
    holds no key in the clear; it is kept outside the logs so that replacing it destroys
    the data key everywhere the engine kept it (crypto-shredding) without touching a
    log. Slots are not removed with a session: a delete first destroys the key (a slot
    holding only the record that it was forgotten), and only a forgotten slot is ever
    removed (`remove_key_slot`)."""

    @abstractmethod
    def load_key_slot(self, dk: str) -> bytes | None:
        """The bytes of the key slot `dk`, None if there is none."""

    @abstractmethod
    def create_key_slot(self, dk: str, data: bytes) -> bool:
        """Keep `data` as the key slot `dk` unless one exists (then False, and nothing
        changes: two writers creating a session's key at once agree on the first),
        durably."""

    @abstractmethod
    def replace_key_slot(self, dk: str, data: bytes, expected: bytes | None = None) -> bool:
        """Replace the key slot `dk` with `data`, atomically and durably; what it held
        before is not kept by the engine. With `expected`, only if the slot holds exactly
        `expected` (compare and replace, as one step: a slot another writer replaced,
        removed or never created is kept, and False), so a rewrap never undoes a forget
        that landed after its read. True if it was replaced (always, without `expected`)."""

    @abstractmethod
    def list_key_slots(self) -> list[str]:
        """The ids of every key slot."""

    @abstractmethod
    def remove_key_slot(self, dk: str, data: bytes) -> bool:
        """Remove the key slot `dk` if it holds exactly `data` (compare and delete, as one
        step: a slot another writer replaced or created meanwhile is kept, and False),
        durably. True if it was removed."""


class RangedEngine(Engine):
    """An engine that reads a byte range of the live log for no more than its length (a
    file: pread), so transcript paging reads the newest messages from the end."""

    @abstractmethod
    def live_view(self, session_id: str) -> AbstractContextManager[LiveView]:
        """A `LiveView` of the live log (an empty one, `EMPTY_HEAD`, for a session
        without one), valid until the context ends."""


class SeqLine(msgspec.Struct, frozen=True):
    """A line of the live log read by its seq: its bytes (no newline), its byte
    `offset` in the live log (for messages) and `before`, the last 25 bytes of the line
    before it, its newline included (which end with the `h` it chains to), or b"" for
    the log's first line."""

    line: bytes
    offset: int
    before: bytes


class SeqEngine(Engine):
    """An engine that reads lines of the live log by their seqs, each for about its own
    length (PostgreSQL: by the lines' primary key), so a reader that keeps an index of
    lines (`eventstore.ops.seek`) reads those lines alone, in one round trip."""

    @abstractmethod
    def lines_at(self, session_id: str, seqs: Sequence[int]) -> dict[int, SeqLine]:
        """The live log's lines of `seqs`, read together (one consistent read); a seq the
        live log does not hold is left out, as is one after the log's opening snapshot
        (which is not a line)."""

    @abstractmethod
    def tail(self, session_id: str, count: int) -> tuple[Head, dict[int, SeqLine]]:
        """The session's head and the live log's lines of its newest `count` seqs, as
        `lines_at` gives them, read together (one consistent read, one round trip): what
        a reader of the log's end needs first, without a read of the head before it."""

    @abstractmethod
    def where(self, session_id: str) -> str:
        """The session's live log's name, for messages."""


class PruningEngine(Engine):
    """An engine that can remove kept history for good (`eventstore.ops.lifecycle`)."""

    @abstractmethod
    def prune_history(self, session_id: str, before_seq: int) -> list[PrunedSegment]:
        """Remove, for good, every kept (archived) segment all of whose lines come before
        `before_seq`; the live log is never touched. Returns what was removed, oldest
        first."""


class FeedItem(Protocol):
    """One line of a global feed: its `position` (opaque, ordered), the session, the
    line's `seq` and its exact bytes."""

    @property
    def position(self) -> Any: ...  # noqa: D102
    @property
    def session_id(self) -> str: ...  # noqa: D102
    @property
    def seq(self) -> int: ...  # noqa: D102
    @property
    def line(self) -> bytes: ...  # noqa: D102


class FeedEngine(Engine):
    """An engine that keeps every session's lines in one global order (PostgreSQL)."""

    @abstractmethod
    def feed(self, after: Any = None, limit: int = 1000) -> Sequence[FeedItem]:
        """Up to `limit` lines of every session after feed position `after` (None, or the
        engine's start position: from the start), in feed order: a line never appears
        later below a position already returned."""


IndexOrder = Literal["updated", "created", "id"]
"""How an index page is sorted: "updated" and "created" newest first (ties by id,
descending), "id" by id ascending."""


class IndexEntry(msgspec.Struct, frozen=True):
    """One session in an engine's session index (`IndexingEngine`).

    `created_us`/`updated_us`: the times (microseconds since the epoch) of the session's
    first and last append as the engine saw them; `last_seq`, `events` (lines in the live
    log) and `bytes` (committed bytes of the live log): its head as of the last write the
    index saw; `labels`: as the last labels batch set them; `deleted`: a tombstone (kept
    for engines that keep them; False otherwise).
    """

    session_id: str
    created_us: int
    updated_us: int
    last_seq: int
    events: int
    bytes: int
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    deleted: bool = False

    def sort_key(self, order: IndexOrder) -> tuple[int, str]:
        """The key a page of `order` is sorted by, descending for times (the id is the
        tiebreak, in the same direction); for "id" the id alone."""
        if order == "updated":
            return (self.updated_us, self.session_id)
        if order == "created":
            return (self.created_us, self.session_id)
        return (0, self.session_id)


def index_after(entry: IndexEntry, after: IndexEntry | None, order: IndexOrder) -> bool:
    """Whether `entry` comes strictly after the cursor `after` in `order` (the keyset
    rule every engine pages by: a page starts just past the previous page's last entry)."""
    if after is None:
        return True
    if order == "id":
        return entry.session_id > after.session_id
    return entry.sort_key(order) < after.sort_key(order)


def index_matches(
    entry: IndexEntry, prefix: str | None, updated_since_us: int | None, labels: dict[str, str]
) -> bool:
    """Whether `entry` passes a page's filters (an id prefix, a lower bound on `updated`,
    labels it must carry with these values)."""
    if prefix is not None and not entry.session_id.startswith(prefix):
        return False
    if updated_since_us is not None and entry.updated_us < updated_since_us:
        return False
    return all(entry.labels.get(k) == v for k, v in labels.items())


def index_appended(
    old: IndexEntry | None,
    session_id: str,
    ts: int,
    labels: dict[str, str] | None,
    head: Head,
) -> IndexEntry:
    """A session's index entry after a batch was appended and `head` is its new head:
    the batch's time `ts` (µs; the engine's clock where the batch carries none) as
    `updated` (and `created`, for its first), the head's seq and size, the `labels` the
    batch sets (None: it sets none)."""
    labels = labels if labels is not None else (old.labels if old else {})
    created = old.created_us if old is not None and old.last_seq else ts
    return IndexEntry(
        session_id,
        created,
        max(ts, created),
        head.seq,
        head.seq - head.base_seq + 1,
        head.size,
        labels,
    )


def index_moved(old: IndexEntry, head: Head) -> IndexEntry:
    """A session's index entry after its live log was replaced (a snapshot installed, a
    repair): the new head's seq, lines and size; its times and labels unchanged."""
    return msgspec.structs.replace(
        old,
        last_seq=head.seq,
        events=head.seq - head.base_seq + 1 if head.seq else 0,
        bytes=head.size,
    )


class IndexingEngine(Engine):
    """An engine that keeps a session index as it writes: every `append` (its `ts_us`,
    `labels` and new head), `install_snapshot`, repair and `remove_session` updates it
    in the same unit as the write where the engine can (memory, databases), or right
    beside it (the file engine, whose index is a cache of the logs: see its docs). A
    page costs about its length, never a read of every session."""

    @abstractmethod
    def index_page(
        self,
        *,
        order: IndexOrder,
        after: IndexEntry | None,
        limit: int | None,
        prefix: str | None = None,
        updated_since_us: int | None = None,
        labels: dict[str, str] | None = None,
    ) -> list[IndexEntry]:
        """Up to `limit` entries (None: all) in `order`, strictly after `after`, passing
        the filters (`index_matches`). Every session with a committed line has an entry
        (after `replace_index` on a store written before the index existed)."""

    def index_stale(self) -> bool:
        """Whether the index may lack a session (an update it refused, logs older than
        it): the face then rebuilds it (`replace_index`) before a page. False by
        default: an engine that updates it in the write's own unit never is."""
        return False

    @abstractmethod
    def replace_index(self, entries: Sequence[IndexEntry], started_us: int) -> None:
        """Make the index hold `entries` (a rebuild from the logs, which the face
        computed, beginning at `started_us`): each replaces the session's entry unless
        that one has a higher `last_seq` (a write since); an index that can hold an
        entry of no session (a file beside the logs) drops those absent from `entries`
        unless a write touched them at or after `started_us` (a session created while
        the rebuild read)."""


# -- choosing an engine by URL ----------------------------------------------------------

SCHEMES: dict[str, str] = {
    "file": "eventstore.engines.file.engine",
    "memory": "eventstore.engines.memory",
    "postgresql": "eventstore.engines.postgres.engine",
    "postgres": "eventstore.engines.postgres.engine",
    "redis": "eventstore.engines.redis.engine",
    "rediss": "eventstore.engines.redis.engine",
    "unix": "eventstore.engines.redis.engine",
}
"""URL scheme -> the module whose `from_url(url, **options) -> Engine` opens it. Modules
are imported only when a URL of their scheme is opened."""


def scheme_of(url_or_path: str | os.PathLike[str]) -> str:
    """The scheme of a store URL; "file" for a path (anything without `scheme://`)."""
    text = os.fspath(url_or_path)
    head, sep, _ = text.partition("://")
    if sep and head and head.replace("+", "").replace("-", "").replace(".", "").isalnum():
        return head.lower()
    return "file"


def _is_secret_key(key: str) -> bool:
    """A connection parameter that holds a secret (`password`, `sslpassword`, ...)."""
    return key.strip().lower().endswith("password")


def split_userinfo(rest: str) -> tuple[str | None, str]:
    """(the userinfo, what follows its `@`) of a URL's text after `scheme://`; (None,
    rest) when it has none. Wider than a parser: a password holding a raw `@`, `/` or `?`
    still lies wholly inside the userinfo found, so printing the URL without it hides all
    of it (`split_url` refuses such a URL for connecting)."""
    i = next((k for k, c in enumerate(rest) if c in "@/"), -1)
    if i >= 0 and rest[i] == "@":
        end = rest.find("/", i)
        j = rest.rfind("@", 0, end if end >= 0 else len(rest))
        return rest[:j], rest[j + 1 :]
    j = rest.rfind("@")
    if j >= 0 and "?" not in rest[:j] and ":" in rest[:j]:
        return rest[:j], rest[j + 1 :]  # a password holding a raw `/`
    return None, rest


_SECRET_PAIR = re.compile(r"""(\b[A-Za-z_]*password\s*=\s*)('(?:[^'\\]|\\.)*'?|[^\s&]*)""", re.I)


def redact_conninfo(text: str) -> str:
    """`text` with the value of every `...password=` pair (libpq's `key=value` form, or a
    URL's query) replaced by `***`."""
    return _SECRET_PAIR.sub(lambda m: f"{m.group(1)}***", text)


def redact_url(url: str) -> str:
    """`url` with any password (in the authority, or a `password=`/`sslpassword=`
    parameter) replaced by `***`: what every message and the CLI print. Text without
    `://` (a path, a libpq `key=value` string) has its `...password=` values hidden."""
    if "://" not in url:
        return redact_conninfo(url)
    scheme, _, rest = url.partition("://")
    userinfo, after = split_userinfo(rest)
    if userinfo is not None and ":" in userinfo:
        rest = f"{userinfo.split(':', 1)[0]}:***@{after}"
    head, sep, query = rest.partition("?")
    if sep:
        query, hsep, fragment = query.partition("#")
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(_is_secret_key(k) for k, _ in pairs):
            query = urlencode([(k, "***" if _is_secret_key(k) else v) for k, v in pairs], safe="*")
            fragment = "***" if hsep else ""
        rest = f"{head}?{query}{hsep}{fragment}"
    return f"{scheme}://{rest}"


_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S+")


def redact_text(text: str) -> str:
    """`text` (an error message, say) with every URL in it passed through `redact_url`,
    and every `...password=` value hidden."""
    return redact_conninfo(_URL_IN_TEXT.sub(lambda m: redact_url(m.group(0)), text))


def is_conninfo(text: str) -> bool:
    """Whether `text` is a libpq `key=value` connection string (`host=db user=app ...`):
    no store URL, and never a directory to create."""
    return "://" not in text and bool(_CONNINFO.match(text))


_CONNINFO = re.compile(
    r"\s*(host|hostaddr|port|dbname|user|password|passfile|service|sslmode|sslpassword"
    r"|connect_timeout|application_name|options|target_session_attrs)\s*=",
    re.I,
)


def open_engine(url_or_path: str | os.PathLike[str], **options: Any) -> Engine:
    """Open the engine a store URL or path names (see the module docstring).

    `options` go to the engine (e.g. `durability` for the file engine; `create=False`:
    a store that is not there is a `StorageError` rather than made, for a caller that
    only reads). Raises
    `UnknownEngineError` for a scheme no engine serves, `InvalidArgumentError` for what
    is no store URL or path (not a str, a NUL in it), and whatever the engine raises
    for a URL it cannot open.
    """
    text = os.fspath(url_or_path) if isinstance(url_or_path, (str, os.PathLike)) else None
    if not isinstance(text, str):
        raise InvalidArgumentError(
            f"a store is named by a URL or a path (a str), not {type(url_or_path).__name__}"
        )
    if "\0" in text:
        # (the text itself is not shown: a URL's password may hold the NUL)
        raise InvalidArgumentError(
            f"a store URL or path holds a NUL, at character {text.index(chr(0))}"
        )
    if is_conninfo(text):
        raise UnknownEngineError(
            "a libpq key=value connection string is not a store URL: write it as"
            " postgresql://USER:PASSWORD@HOST:PORT/DBNAME?PARAM=VALUE (percent-encoded)"
        )
    scheme = scheme_of(url_or_path)
    module_name = SCHEMES.get(scheme)
    if module_name is None:
        raise UnknownEngineError(
            f"no storage engine for {scheme}:// URLs (known: {', '.join(sorted(SCHEMES))})"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UnknownEngineError(
            f"the {scheme}:// engine ({module_name}) cannot be imported: {exc}"
        ) from exc
    engine = module.from_url(url_or_path, **options)
    if not isinstance(engine, Engine):
        raise TypeError(f"{module_name}.from_url returned {type(engine).__name__}, not an Engine")
    return engine
