"""The PostgreSQL engine: sessions on a PostgreSQL server shared by a fleet of machines.

`SessionStore("postgresql://user:pass@host:5432/db")` (or `postgres://`) opens it; the
query parameter `schema=NAME` picks the schema (default `eventstore`), every other
parameter goes to libpq. Needs the `[postgres]` extra (psycopg 3 with its binary build
and its connection pool).

What it stores and how (the tables, the two server-side functions, the global feed
order) is in `eventstore.engines.postgres.schema`. In short: one row per line holding
its exact bytes (so the hash chain, verify and export agree byte for byte with the file
engine), a `sessions` row per session holding its head, which every writer locks, and
one server-side function call per append (one round trip, one transaction): lock the
session, compare the head with the expected one, insert the lines (each gets its place in
the global feed), record the idempotency key and fingerprint, and, only while some
backend follows (`wait`'s LISTEN connection registers itself), NOTIFY in the same
transaction: delivered at the commit. No follower, no NOTIFY: a notifying commit
serializes with every other notifying commit on the server.

Positions are (log id, seq, byte offset in the live log); the log id changes whenever the
live log is replaced (a snapshot installed, a repair, a removal), which is how a reader
knows to start over. `wait` uses LISTEN/NOTIFY as a wake-up only: the caller re-reads.

The engine's `durability` option is accepted and ignored: the server's own settings
(`synchronous_commit`, `fsync`) decide what a commit survives.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from datetime import datetime
from typing import Any, NamedTuple, TypeVar, cast

import msgspec

from eventstore import process
from eventstore.engines.base import (
    EMPTY_HEAD,
    READ_AHEAD,
    BytesCacheReader,
    BytesSegment,
    CacheReader,
    CachingEngine,
    ColdStart,
    EncodedBatch,
    FeedEngine,
    Head,
    HeadMovedError,
    History,
    IndexEntry,
    IndexingEngine,
    IndexOrder,
    InstallResult,
    KeyEngine,
    Position,
    ReadResult,
    RepairHold,
    Segment,
    SeqEngine,
    SeqLine,
    UnreadableSegment,
    cache_part_name,
    head_disputed,
    read_whole,
    redact_text,
)
from eventstore.engines.postgres.handover import Handover
from eventstore.engines.postgres.schema import (
    SCHEMA_VERSION,
    SchemaVersionError,
    channel_of,
    ensure_schema,
    quote_schema,
)
from eventstore.engines.postgres.url import (
    DEFAULT_SCHEMA,
    redact_url,
    scrub,
    secrets_of,
    split_url,
)
from eventstore.engines.raw import last_line_end
from eventstore.errors import (
    CorruptLogError,
    InvalidArgumentError,
    StorageError,
)
from eventstore.format.chain import LINE_END_LEN, link_ending, split_hash
from eventstore.format.depth import HEAD_DECODER
from eventstore.logger import log

try:
    import psycopg
    import psycopg_pool
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "the PostgreSQL engine needs the [postgres] extra:"
        " pip install 'harness-eventstore[postgres]'"
    ) from exc

__all__ = [
    "ARRAY_BYTES",
    "DEFAULT_SCHEMA",
    "SCHEMA_VERSION",
    "FEED_START",
    "LISTEN_RETRY",
    "LISTEN_RETRY_MAX",
    "STALL_WARNING",
    "FeedBlocker",
    "FeedEntry",
    "FeedPosition",
    "PgPosition",
    "PostgresEngine",
    "SchemaVersionError",
    "from_url",
    "init_db",
    "redact_url",
    "split_url",
]

_SNAPSHOT_PREFIX = b'{"type":"snapshot",'
_labels_decoder = msgspec.json.Decoder(dict[str, str])
_head_decoder = HEAD_DECODER


class PgPosition(msgspec.Struct, Position, frozen=True):
    """A read position: the live log (`log_id`), the last line read (`seq`) and the byte
    offset just after it in the live log."""

    log_id: int
    seq: int
    offset: int


class FeedPosition(NamedTuple):
    """A place in the global feed: the number of the last line read (`seq`), handed out
    in feed order; `FeedPosition(0)` is the start. Store it as an integer: it means the
    same after a pg_dump restore or logical replication into another cluster.

    A position of schema version 1 (the pair (transaction id, line number)) is still
    taken by `feed`, and read as the last line it names."""

    seq: int


FEED_START = FeedPosition(0)


class FeedEntry(msgspec.Struct, frozen=True):
    """One line of the global feed: its `position` (increasing across every session of
    the store, see `eventstore.engines.postgres.schema`), the session, the line's `seq`
    and its exact bytes."""

    position: FeedPosition
    session_id: str
    seq: int
    line: bytes


class FeedBlocker(msgspec.Struct, frozen=True):
    """A transaction still open on the server that holds the feed back: every line a
    later transaction committed waits for it to end (see
    `eventstore.engines.postgres.schema`). `xid` its transaction id; for a backend its
    `pid` and `state` (e.g. "idle in transaction"), for a prepared transaction its
    `gid`; `database`, `user`, and `since`, when it began (or was prepared). A field the
    server does not show this role is None."""

    xid: int
    pid: int | None
    gid: str | None
    database: str | None
    user: str | None
    state: str | None
    since: datetime | None

    def describe(self) -> str:
        """One line for a person: what it is, where, since when."""
        what = (
            f"prepared transaction {self.gid!r}"
            if self.gid is not None
            else (f"backend pid {self.pid}" if self.pid is not None else "a transaction")
        )
        state = f", {self.state}" if self.state and self.gid is None else ""
        since = f" since {self.since.isoformat(timespec='seconds')}" if self.since else ""
        return (
            f"{what} (xid {self.xid}, database {self.database!r}, user {self.user!r}{state}){since}"
        )


STALL_WARNING = 60.0
"""Seconds the feed's horizon may stay behind committed lines before `feed` logs a
warning naming what holds it (`PostgresEngine.feed_blockers`)."""

LISTEN_RETRY = 60.0
"""Seconds after the server refuses a follower's LISTEN registration (a role that may
not register, a read-only server) before it is tried again, doubled after each refusal
up to `LISTEN_RETRY_MAX`: a grant or a promotion is noticed, and a role refused for
good costs one connection every few minutes, not one per poll. Waiters poll meanwhile."""

LISTEN_RETRY_MAX = 600.0
"""The longest wait between two tries of a refused LISTEN registration."""


def from_url(url: str | os.PathLike[str], **options: Any) -> PostgresEngine:
    """Open the PostgreSQL engine a `postgresql://` URL names (see the module docstring).

    Options: `pool_size` (connections per process, default 8), `stall_warning` (seconds,
    default `STALL_WARNING`: see `PostgresEngine.feed`), `create` (False: a schema that
    does not exist is a `StorageError`, not made), `durability` (ignored).
    """
    options.pop("durability", None)
    create = bool(options.pop("create", True))
    try:
        pool_size = int(options.pop("pool_size", 8))
        stall_warning = float(options.pop("stall_warning", STALL_WARNING))
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"a PostgreSQL engine option is no number: {exc}") from None
    if options:
        raise InvalidArgumentError(
            f"unknown PostgreSQL engine options: {', '.join(sorted(options))}"
        )
    return PostgresEngine(
        os.fspath(url), pool_size=pool_size, stall_warning=stall_warning, create=create
    )


def _first_line(exc: BaseException, secrets: list[str]) -> str:
    """The first line of a psycopg error, without any secret of the URL (libpq quotes
    the parts of a URL it cannot parse) nor any `password=` value."""
    text = scrub(str(exc), secrets).strip()  # (a secret may hold a line break)
    return redact_text(text.splitlines()[0] if text else type(exc).__name__)


def _storage_error(engine: PostgresEngine, doing: str, exc: BaseException) -> StorageError:
    return StorageError(f"{engine.url}: {doing} failed: {_first_line(exc, engine._secrets)}")


T = TypeVar("T")


_SLOT = "keyslot:"  # the `meta` rows holding key slots


class PostgresEngine(FeedEngine, CachingEngine, KeyEngine, IndexingEngine, SeqEngine):
    """Sessions in a PostgreSQL database: see the module docstring. It keeps the global
    feed (`FeedEngine`), the face's fold caches (`CachingEngine`) and the session index
    (`IndexingEngine`: columns of the sessions table, written by `append` in its
    transaction), and reads lines by their seqs (`SeqEngine`: the lines' primary key);
    no ranged reads or pruning."""

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 8,
        stall_warning: float = STALL_WARNING,
        create: bool = True,
    ) -> None:
        self.url = redact_url(url)
        self.stall_warning = stall_warning
        self._stall: tuple[int, float, bool] | None = None  # (horizon, since, warned)
        self._secrets = secrets_of(url)
        self._conninfo, self.schema = split_url(url)
        self._q = quote_schema(self.schema)
        self._channel = channel_of(self.schema)
        self._pool_size = max(1, pool_size)
        self._lock = threading.Lock()
        process.track(self)
        self._pid = os.getpid()
        self._pool: psycopg_pool.ConnectionPool[Any] | None = None
        self._listener: _Listener | None = None
        self._closed = False
        self._sql = _Statements(self._q)
        # the schema is checked on a connection of our own (a wrong URL fails at once,
        # with the server's words), then handed to the pool as its first connection
        self._handover = Handover(_set_up)
        try:
            conn = self._handover.connection_class.connect(
                self._conninfo, autocommit=True, connect_timeout=10
            )
            try:
                ensure_schema(conn, self.schema, create=create)
            except BaseException:
                conn.close()
                raise
            self._handover.give(conn)
            # the pool's worker takes it now, not after the first read has waited for
            # a thread switch (up to the interpreter's 5 ms switch interval)
            self._get_pool().wait(timeout=10)
        except BaseException as exc:
            self.close()
            if isinstance(exc, psycopg.Error):
                raise _storage_error(self, "opening the database", exc) from None
            raise

    def __repr__(self) -> str:
        return f"PostgresEngine({self.url!r})"

    def reset_after_fork(self) -> None:
        """A fresh lock in a forked child (another thread may have held it at the fork);
        the connections are dropped on first use (`_get_pool`)."""
        self._lock = threading.Lock()

    # -- connections ------------------------------------------------------------------

    def _get_pool(self) -> psycopg_pool.ConnectionPool[Any]:
        if self._closed:
            raise StorageError(f"{self.url}: the engine is closed")
        pool = self._pool
        if pool is not None and self._pid == os.getpid():
            return pool
        with self._lock:
            if self._pid != os.getpid():
                # a forked child: the parent's connections are not ours to use or close
                # (closing would end the parent's server sessions); keep them unreferenced
                # by us but alive, so no finalizer sends them a Terminate message
                _ORPHANS.extend(x for x in (self._pool, self._listener) if x is not None)
                self._pool = None
                self._listener = None
                self._lock = threading.Lock()
                self._pid = os.getpid()
            if self._pool is None:
                self._pool = psycopg_pool.ConnectionPool(
                    self._conninfo,
                    connection_class=self._handover.connection_class,
                    configure=_CONNECTIONS.add,
                    min_size=1,
                    max_size=self._pool_size,
                    kwargs={"autocommit": True},
                    open=True,
                    name=f"eventstore-{self.schema}",
                )
            return self._pool

    @contextmanager
    def _conn(self, doing: str) -> Iterator[psycopg.Connection[Any]]:
        try:
            with self._get_pool().connection(timeout=30) as conn:
                yield conn
        except psycopg_pool.PoolTimeout as exc:
            raise _storage_error(self, doing, exc) from None
        except psycopg.OperationalError as exc:
            raise _storage_error(self, doing, exc) from None
        except psycopg.Error as exc:
            raise _storage_error(self, doing, exc) from None

    def _query(self, doing: str, run: Callable[[psycopg.Connection[Any]], T]) -> T:
        """`run(conn)` for a read, on a pooled connection; again on another when the
        server ended that one (after a server restart every pooled connection is dead,
        and a read is safe to repeat), at most once per connection the pool holds."""
        for left in range(self._pool_size, -1, -1):
            conn = None
            try:
                with self._get_pool().connection(timeout=30) as conn:
                    return run(conn)
            except psycopg_pool.PoolTimeout as exc:
                raise _storage_error(self, doing, exc) from None
            except psycopg.OperationalError as exc:
                if left and conn is not None and conn.broken:
                    continue  # the pool discards it
                raise _storage_error(self, doing, exc) from None
            except psycopg.Error as exc:
                raise _storage_error(self, doing, exc) from None
        raise AssertionError("unreachable")

    def where(self, session_id: str) -> str:
        """A session's live log's name for messages."""
        return f"{self.url}#{session_id}"

    # -- reading ----------------------------------------------------------------------

    def read(self, session_id: str, position: Position | None) -> ReadResult:
        """The committed lines after `position` (None: from the beginning)."""
        pos = position if isinstance(position, PgPosition) else None
        log_id = pos.log_id if pos is not None else -1
        after = pos.seq if pos is not None else 0
        offset = pos.offset if pos is not None else 0
        params = {"log": log_id, "after": after, "offset": offset, "sid": session_id}
        # the common read, on in the same log: a statement without the opening
        # snapshot's part, one row (planned in a fraction of the time as a backend's
        # first); no lines, of another log, says the log was replaced
        rows: list[Any] = []
        if pos is not None:
            row = self._query(
                "reading a session",
                lambda conn: conn.execute(self._sql.read_on, params, binary=True).fetchone(),
            )
            if row is not None and row[6] is not None:
                rows = _read_rows(row[:6], None, row[6])
        if not rows:
            rows = self._rows(self._sql.read, params)
        return self._read_result(session_id, rows, pos, position is not None)

    def _read_result(
        self, session_id: str, rows: list[Any], pos: PgPosition | None, from_position: bool
    ) -> ReadResult:
        """The `ReadResult` of a read's rows (the head's, then the lines'): from `pos`
        if the log is still its, else from the start (a reset when `from_position`)."""
        after = pos.seq if pos is not None else 0
        where = self.where(session_id)
        if not rows:
            return ReadResult(b"", EMPTY_HEAD, from_position, where)
        head = _head_of(rows[0][2:])
        data = b"".join([r[8] for r in rows[1:]])
        same = pos is not None and rows[0][2] == pos.log_id
        # a row deleted at the end would else read as a shorter, valid log (anything
        # wrong before the end the fold reports, where it is)
        end = _end_seq(rows, after if same else 0)
        if end is not None and end != head.seq:
            raise _short_of_head(where, len(data), end, head.seq)
        if same:
            assert pos is not None
            return ReadResult(data, head, False, where, pos.offset)
        return ReadResult(data, head, from_position, where, 0)

    def _rows(self, statement: str, params: dict[str, Any]) -> list[Any]:
        """The rows of `read`'s statement from the start."""
        return self._query(
            "reading a session",
            lambda conn: conn.execute(statement, params, binary=True).fetchall(),
        )

    def head(self, session_id: str) -> Head:
        """The session's head (one indexed row)."""
        row = self._query(
            "reading a head", lambda conn: conn.execute(self._sql.head, (session_id,)).fetchone()
        )
        return EMPTY_HEAD if row is None else _head_of(row)

    def history(self, session_id: str) -> History:
        """Every kept segment, then the live log, read in one repeatable-read snapshot."""

        def run(conn: psycopg.Connection[Any]) -> History:
            with conn.transaction():
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
                return self._history_on(conn, session_id)

        return self._query("reading a session's history", run)

    def _history_on(self, conn: psycopg.Connection[Any], session_id: str) -> History:
        """`history`'s reads, on `conn` in the transaction it is in (a repair hold's:
        not another pooled connection, which a pool of one would never give it)."""
        srow = conn.execute(self._sql.session_row, (session_id,)).fetchone()
        if srow is None:
            return History([])
        sid, snap_seq, head_seq = srow
        snaps = conn.execute(self._sql.snapshots_of, (sid,), binary=True).fetchall()
        lines = conn.execute(self._sql.lines_of, (sid,), binary=True).fetchall()
        segments = _segments(self.where(session_id), snap_seq, snaps, lines)
        # as `read` checks it: rows deleted at the end are no shorter, valid log
        live = segments.pop() if segments and not segments[-1].archived else None
        checked = _checked_live(live, self.where(session_id), int(head_seq))
        return History(segments if checked is None else [*segments, checked])

    def wait(self, session_id: str, position: Position | None, timeout: float) -> bool:
        """Block until the session's head is no longer `position` (True) or `timeout`
        seconds pass (False). A NOTIFY (or the listener reconnecting) only wakes it to
        look again: a notification of an append it has already read (one delivered while
        it read) does not end the wait."""
        deadline = time.monotonic() + max(timeout, 0.0)
        listener = self._get_listener()
        while True:
            remaining = deadline - time.monotonic()
            mark = listener.mark(session_id, max(remaining, 0.0))
            if self.head(session_id).position != position:
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if mark is None:  # no listener connection: poll instead
                time.sleep(min(remaining, 0.2))
            else:
                listener.wait_change(session_id, mark, remaining)

    def _get_listener(self) -> _Listener:
        self._get_pool()  # resets per-process state in a forked child
        with self._lock:
            if self._listener is None:
                self._listener = _Listener(self._conninfo, self._channel, self._q)
            return self._listener

    # -- the global feed --------------------------------------------------------------

    def feed(self, after: FeedPosition | None = FEED_START, limit: int = 1000) -> list[FeedEntry]:
        """Up to `limit` lines of every session after feed position `after`, in feed
        order: a line never appears later below a position already returned (see
        `eventstore.engines.postgres.schema` for why; None: from the start). Lines dropped
        by a compaction without history, a repair, or removing their session, are not in
        it.

        The answer is as of the read's start (one statement, one snapshot), and a line
        waits for every older transaction on the server to end: an empty answer says
        nothing of appends that committed while the read ran, nor of acknowledged
        appends an older transaction still holds back. A tailing reader reads again.

        When committed lines stay held back behind the same open transaction for
        `stall_warning` seconds, a warning is logged (logger "eventstore") naming what
        holds them (`feed_blockers`), once per stall."""
        start = self._feed_start(after)
        rows = self._query(
            "reading the feed",
            lambda conn: conn.execute(self._sql.feed, (start, limit), binary=True).fetchall(),
        )
        held = [int(r[2]) for r in rows if r[0] == 0]
        if held:
            self._note_held(held[0])
        else:
            self._stall = None
        return [
            FeedEntry(FeedPosition(int(r[1])), r[2], int(r[3]), bytes(r[4]))
            for r in rows
            if r[0] == 1
        ]

    def _feed_start(self, after: object) -> int:
        """The feed_seq a position names (see `FeedPosition`)."""
        if after is None:
            return 0
        if isinstance(after, int) and not isinstance(after, bool) and after >= 0:
            return after
        if isinstance(after, tuple) and len(after) == 1:
            return self._feed_start(after[0])
        if (
            isinstance(after, tuple)
            and len(after) == 2
            and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in after)
        ):
            tx, pos = after
            row = self._query(
                "reading a feed position of schema version 1",
                lambda conn: conn.execute(self._sql.legacy_position, (str(tx), pos)).fetchone(),
            )
            return int(row[0]) if row else 0
        raise InvalidArgumentError(
            f"{self.url}: {after!r} is no feed position (a FeedPosition, or the integer it holds)"
        )

    def _note_held(self, horizon: int) -> None:
        """A feed read found committed lines held back at `horizon` (the oldest open
        transaction): warn once when the same horizon has held them for too long."""
        now = time.monotonic()
        stall = self._stall
        if stall is None or stall[0] != horizon:
            self._stall = (horizon, now, False)
            return
        if stall[2] or now - stall[1] < self.stall_warning:
            return
        self._stall = (horizon, stall[1], True)
        blockers = self.feed_blockers()
        log.warning(
            "%s: the global feed has held back committed lines for %.0f s behind %s;"
            " end it (or set idle_in_transaction_session_timeout: see the PostgreSQL"
            " page of the docs)",
            self.url,
            now - stall[1],
            "; ".join(b.describe() for b in blockers) or "a transaction that has since ended",
        )

    def feed_blockers(self) -> list[FeedBlocker]:
        """The transactions open on the server (in any database, prepared ones too) that
        hold committed lines of this store out of the feed, oldest first; [] when the
        feed holds nothing back."""
        rows = self._query(
            "looking for what holds the feed back",
            lambda conn: conn.execute(self._sql.feed_blockers).fetchall(),
        )
        return [
            FeedBlocker(int(r[0]), r[1], r[2], r[3] or r[4], r[5] or r[6], r[7], r[8] or r[9])
            for r in rows
        ]

    def lines_at(self, session_id: str, seqs: Sequence[int]) -> dict[int, SeqLine]:
        """One statement: each line with the last bytes of the line before it (those
        alone read: the lines are stored uncompressed, so a slice of one is read
        without the rest)."""
        rows = self._query(
            f"reading lines of {session_id!r} by seq",
            lambda conn: conn.execute(
                self._sql.lines_at, (session_id, list(seqs)), binary=True
            ).fetchall(),
        )
        return _seq_lines(rows)

    def tail(self, session_id: str, count: int) -> tuple[Head, dict[int, SeqLine]]:
        """One statement: the head and the newest `count` lines, as `lines_at` reads
        them."""
        rows = self._query(
            f"reading the end of {session_id!r}",
            lambda conn: conn.execute(
                self._sql.tail, (max(1, int(count)), session_id), binary=True
            ).fetchall(),
        )
        if not rows:
            return EMPTY_HEAD, {}
        return _head_of(rows[0]), _seq_lines(r[6:] for r in rows if r[6] is not None)

    # -- caches -----------------------------------------------------------------------

    def open_cache(self, session_id: str, name: str) -> tuple[Head, CacheReader] | None:
        """The cache kept under `name`, read whole in one query with the line at its
        head, if its head is still a point of the live log: the same log (log_id), no
        further than the head, and the line there has the `h` it was stored with. The
        same statement reads the session's head and up to `READ_AHEAD` lines after the
        cache's: the reader's `read_on`, which the fold from the cache takes instead of
        a read (a round trip less)."""
        params = {"sid": session_id, "name": name, "ahead": READ_AHEAD}
        row = self._query(
            "reading a fold cache",
            lambda conn: conn.execute(self._sql.open_cache_on, params, binary=True).fetchone(),
        )
        if row is None:
            return None
        if row[15]:  # at the live log's opening snapshot (rare): its line in a statement
            return self._cache_at(session_id, name)  # of its own, and no lines after
        found = _live_cache(row[:8])
        if found is not None and row[14] is not None:  # (None: more than READ_AHEAD after)
            pos = cast(PgPosition, found[0].position)
            rows = _read_rows(row[8:14], None, row[14])
            with suppress(CorruptLogError):  # (the fold's own read says so)
                found[1].read_on = self._read_result(session_id, rows, pos, True)
        return found

    def open_cold(self, session_id: str, name: str | None, mark: str | None) -> ColdStart:
        """The cache `name` as `open_cache` reads it; when there is none, one statement
        for the cache `mark` and the live log from its start (its opening snapshot and
        up to `READ_AHEAD` lines). (Not one statement for all three: as a new server
        session's first, the larger statement took ~0.6 ms more to plan than the
        cache's own, and a cold load with a cache is the common one.)"""
        found = None if name is None else self.open_cache(session_id, name)
        if found is not None:
            return ColdStart(found)
        params = {"sid": session_id, "mark": mark or "", "ahead": READ_AHEAD}
        row = self._query(
            "reading a fold cache",
            lambda conn: conn.execute(self._sql.open_start, params, binary=True).fetchone(),
        )
        if row is None:  # no session
            return ColdStart(None, None, self._read_result(session_id, [], None, False))
        kept = None if row[0] is None else read_whole(_live_cache(row[:8]))
        read_on = None
        if row[16] is not None:  # (None: more than READ_AHEAD lines)
            snapshot = None if row[15] is None else (row[14], row[15])
            with suppress(CorruptLogError):  # (the fold's own read says so)
                read_on = self._read_result(
                    session_id, _read_rows(row[8:14], snapshot, row[16]), None, False
                )
        return ColdStart(None, kept, read_on)

    def load_cache(self, session_id: str, name: str) -> tuple[Head, bytes] | None:
        """`open_cache`, read whole, and without the lines after it (a small cache, such
        as a checked prefix, is not followed by a read from its head)."""
        return read_whole(self._cache_at(session_id, name))

    def _cache_at(self, session_id: str, name: str) -> tuple[Head, CacheReader] | None:
        """The cache `name` checked as `open_cache` checks it, with nothing more."""
        row = self._query(
            "reading a fold cache",
            lambda conn: conn.execute(self._sql.open_cache, (name, session_id), binary=True)
            .fetchone(),
        )  # fmt: skip
        return None if row is None else _live_cache(row[1:])

    def open_cache_parts(
        self, session_id: str, name: str, count: int
    ) -> Iterator[tuple[Head, CacheReader] | None]:
        """The parts `name#0` .. `name#<count - 1>` of the session's cache, in order,
        read in one query: checked against the live log as `open_cache` checks one (in
        the same query, that costs an index lookup a part), all held in memory at once."""
        names = [cache_part_name(name, k) for k in range(count)]
        rows = self._query(
            "reading fold cache parts",
            lambda conn: conn.execute(
                self._sql.open_cache_parts, (names, session_id), binary=True
            ).fetchall(),
        )
        found = {row[0]: row for row in rows}
        for part in names:
            row = found.pop(part, None)  # each part's bytes freed once given
            yield None if row is None else _live_cache(row[1:])

    def store_cache(self, session_id: str, name: str, head: Head, data: list[bytes]) -> None:
        """Keep `data` under `name` for the session at `head` (one statement, replacing
        what was kept); nothing when the session has no log or `head` is not of its live
        log."""
        pos = head.position
        if not isinstance(pos, PgPosition):
            return
        params = (
            name, pos.log_id, head.seq, head.link, head.h, head.base_seq, head.size,
            b"".join(data), session_id, pos.log_id,
        )  # fmt: skip
        with self._conn(f"saving a fold cache of {session_id!r}") as conn:
            conn.execute(self._sql.store_cache, params, binary=True)

    keeps_cache_parts = True

    def remove_cache_parts(self, session_id: str, name: str, start: int) -> None:
        """Remove the caches kept under `name#k`, k >= `start` (one statement)."""
        prefix = name + "#"
        n = len(prefix)
        params = (session_id, n, prefix, n + 1, n + 1, start)
        with self._conn(f"removing fold cache parts of {session_id!r}") as conn:
            conn.execute(self._sql.remove_cache_parts, params)

    # -- writing ----------------------------------------------------------------------

    def append(self, session_id: str, batch: EncodedBatch, expected: Head) -> Head:
        """One round trip: the server-side `append` function (see
        `eventstore.engines.postgres.schema`)."""
        data = batch.data
        if not data.endswith(b"\n"):
            raise ValueError("an encoded batch must end with a newline")
        lines = [line + b"\n" for line in data.split(b"\n")[:-1]]
        opening = expected.seq == 0 and lines[0].startswith(_SNAPSHOT_PREFIX)
        if not opening and batch.first_seq != expected.seq + 1:
            raise ValueError(
                f"{self.where(session_id)}: a batch starting at seq {batch.first_seq}"
                f" cannot follow seq {expected.seq}"
            )
        params = (
            session_id,
            expected.seq,
            expected.link,
            batch.first_seq,
            lines,
            batch.hashes[-1] if batch.hashes else "",
            batch.link,
            opening,
            None if batch.key is None else _stored_key(batch.key),
            batch.fingerprint,
            batch.ts_us,
            None if batch.labels is None else msgspec.json.encode(batch.labels).decode(),
        )
        try:
            with self._get_pool().connection(timeout=30) as conn:
                row = conn.execute(self._sql.append, params, binary=True).fetchone()
        except (psycopg_pool.PoolTimeout, psycopg_pool.PoolClosed) as exc:
            raise _storage_error(self, "appending", exc) from None
        except psycopg.OperationalError as exc:
            if exc.sqlstate is not None and exc.sqlstate[:2] != "08" and exc.sqlstate not in (
                "57P01", "57P02",
            ):  # fmt: skip
                # the server refused (a lock or statement timeout...): rolled back
                raise _storage_error(self, f"appending to {session_id!r}", exc) from None
            # the connection died: the commit may or may not have happened; the face's
            # idempotency keys make a retry safe
            raise StorageError(
                f"{self.where(session_id)}: append of seq {batch.first_seq}..{batch.last_seq}"
                f" failed (the connection was lost; it may or may not be committed):"
                f" {_first_line(exc, self._secrets)}"
            ) from None
        except psycopg.errors.UniqueViolation as exc:
            if exc.diag.constraint_name != "lines_pkey":
                raise _storage_error(self, f"appending to {session_id!r}", exc) from None
            # (every append writes its lines and its head in one transaction: a row at
            # a seq past the head was inserted from outside; nothing was written)
            raise CorruptLogError(
                self.where(session_id),
                0,
                batch.first_seq,
                "the live log holds a line past its head (a row inserted from outside"
                " the store): nothing is appended on it; `eventstore repair` cuts it",
            ) from None
        except psycopg.Error as exc:
            raise _storage_error(self, f"appending to {session_id!r}", exc) from None
        assert row is not None
        head = _head_of(row[1:])
        if row[0]:
            raise HeadMovedError(self.where(session_id), expected, head)
        return head

    def install_snapshot(
        self, session_id: str, line: bytes, covers: Head, *, keep_history: bool
    ) -> InstallResult:
        """The server-side `install_snapshot` function: one transaction under the row lock."""
        pos = covers.position
        split = split_hash(line.rstrip(b"\n"))
        if not line.endswith(b"\n") or split is None:
            raise ValueError("a snapshot line must be one hashed line ending in a newline")
        if not isinstance(pos, PgPosition):
            raise HeadMovedError(self.where(session_id), covers, self.head(session_id))
        with self._conn(f"installing a snapshot of {session_id!r}") as conn:
            row = conn.execute(
                self._sql.install,
                (session_id, pos.log_id, covers.seq, line, split[1], keep_history),
                binary=True,
            ).fetchone()
        assert row is not None
        head = _head_of(row[1:7])
        if row[0]:
            raise HeadMovedError(self.where(session_id), covers, head)
        archived = f"{self.where(session_id)}@{pos.log_id}" if keep_history else None
        return InstallResult(head, archived, int(row[7]), head.size)

    @contextmanager
    def hold(self, session_id: str) -> Iterator[RepairHold]:
        """Lock the session row in a transaction held until the block ends."""
        with self._conn(f"holding {session_id!r} for repair") as conn, conn.transaction():
            hold = _PgRepairHold(self, conn, session_id)
            yield hold

    # -- sessions ---------------------------------------------------------------------

    def list_sessions(self) -> list[str]:
        """Every session with a committed line, sorted as Python sorts str."""
        rows = self._query(
            "listing sessions", lambda conn: conn.execute(self._sql.list_sessions).fetchall()
        )
        return sorted(r[0] for r in rows)

    # -- key slots (`KeyEngine`): rows `keyslot:<data key id>` of `meta`, so no schema
    # change; a replaced row's old version lives on as a dead tuple until VACUUM, and in
    # WAL and backups (docs/encryption.md says what crypto-shredding reaches)

    def load_key_slot(self, dk: str) -> bytes | None:
        """The key slot `dk`."""

        def run(conn: psycopg.Connection[Any]) -> bytes | None:
            row = conn.execute(
                f"SELECT value FROM {self._q}.meta WHERE name = %s", (_SLOT + dk,)
            ).fetchone()
            return None if row is None else str(row[0]).encode()

        return self._query("reading a key slot", run)

    def create_key_slot(self, dk: str, data: bytes) -> bool:
        """Keep the key slot `dk` unless one exists (one INSERT ... ON CONFLICT DO NOTHING)."""
        with self._conn("creating a key slot") as conn, conn.transaction():
            cur = conn.execute(
                f"INSERT INTO {self._q}.meta (name, value) VALUES (%s, %s)"
                " ON CONFLICT (name) DO NOTHING",
                (_SLOT + dk, data.decode()),
            )
            return cur.rowcount == 1

    def replace_key_slot(self, dk: str, data: bytes, expected: bytes | None = None) -> bool:
        """Replace the key slot `dk` (an upsert; with `expected`, one conditional UPDATE),
        committed before it returns."""
        with self._conn("replacing a key slot") as conn, conn.transaction():
            if expected is None:
                conn.execute(
                    f"INSERT INTO {self._q}.meta (name, value) VALUES (%s, %s)"
                    " ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value",
                    (_SLOT + dk, data.decode()),
                )
                return True
            cur = conn.execute(
                f"UPDATE {self._q}.meta SET value = %s WHERE name = %s AND value = %s",
                (data.decode(), _SLOT + dk, expected.decode()),
            )
            return cur.rowcount == 1

    def list_key_slots(self) -> list[str]:
        """Every key slot's id."""

        def run(conn: psycopg.Connection[Any]) -> list[str]:
            rows = conn.execute(
                f"SELECT substr(name, {len(_SLOT) + 1}) FROM {self._q}.meta"
                " WHERE starts_with(name, %s) ORDER BY name",
                (_SLOT,),
            ).fetchall()
            return [str(r[0]) for r in rows]

        return self._query("listing key slots", run)

    def remove_key_slot(self, dk: str, data: bytes) -> bool:
        """Remove the key slot `dk` if it holds `data` (one conditional DELETE)."""
        with self._conn("removing a key slot") as conn, conn.transaction():
            cur = conn.execute(
                f"DELETE FROM {self._q}.meta WHERE name = %s AND value = %s",
                (_SLOT + dk, data.decode()),
            )
            return cur.rowcount == 1

    # -- the session index -------------------------------------------------------------

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
        """One ordered query over the sessions table's indexes (labels by jsonb
        containment); ids compared by their bytes (`COLLATE "C"`), as Python compares
        str, so pages agree with the other engines."""
        where = ["(head_seq > 0 OR snap_seq > 0)"]
        args: list[object] = []
        col = {"updated": "updated_us", "created": "created_us"}.get(order)
        sid = 'session_id COLLATE "C"'
        if after is not None:
            if col is None:
                where.append(f"{sid} > %s")
                args.append(after.session_id)
            else:
                where.append(f"({col}, {sid}) < (%s, %s)")
                args += [after.sort_key(order)[0], after.session_id]
        if prefix:
            where.append("left(session_id, %s) = %s")
            args += [len(prefix), prefix]
        if updated_since_us is not None:
            where.append("updated_us >= %s")
            args.append(updated_since_us)
        if labels:
            where.append("labels @> %s::jsonb")
            args.append(msgspec.json.encode(labels).decode())
        ordering = f"{sid} ASC" if col is None else f"{col} DESC, {sid} DESC"
        sql = (
            f"SELECT {self._sql.index_columns} FROM {self._q}.sessions"
            f" WHERE {' AND '.join(where)} ORDER BY {ordering}"
        )
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        rows = self._query("paging the session index", lambda c: c.execute(sql, args).fetchall())
        return [
            IndexEntry(r[0], r[1], r[2], r[3], r[4], r[5], _labels_decoder.decode(r[6]))
            for r in rows
        ]

    def index_stale(self) -> bool:
        """Whether the schema's migration found sessions the index has no times for."""
        row = self._query(
            "reading the session index", lambda c: c.execute(self._sql.index_stale).fetchone()
        )
        return row is not None

    def replace_index(self, entries: Sequence[IndexEntry], started_us: int) -> None:
        """Write a rebuild's times and labels (rows are the sessions: nothing to drop)."""
        rows = [
            (e.created_us, e.updated_us, msgspec.json.encode(e.labels).decode(),
             e.session_id, e.last_seq)
            for e in entries
        ]  # fmt: skip
        with self._conn("rebuilding the session index") as conn, conn.transaction():
            with conn.cursor() as cur:
                cur.executemany(self._sql.index_set, rows)
            conn.execute(self._sql.index_fresh)

    def remove_session(self, session_id: str) -> bool:
        """Delete the session row and its lines in one transaction, under the row's
        lock (an append waits for it, then finds no session); its snapshots, keys and
        saved bytes go with the row (ON DELETE CASCADE)."""
        with self._conn(f"removing {session_id!r}") as conn, conn.transaction():
            row = conn.execute(self._sql.remove_lock, (session_id,)).fetchone()
            if row is None:
                return False
            conn.execute(self._sql.drop_all_lines, (row[0],))
            conn.execute(self._sql.remove, (row[0],))
            conn.execute("SELECT pg_notify(%s, %s)", (self._channel, session_id))
            return bool(row[1])

    def close(self) -> None:
        """Close the pool and the listener (idempotent)."""
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
            listener, self._listener = self._listener, None
            mine = self._pid == os.getpid()
        if not mine:
            _ORPHANS.extend(x for x in (pool, listener) if x is not None)
            return
        if listener is not None:
            listener.close()
        if pool is not None:
            pool.close()
        self._handover.close()


_ORPHANS: list[object] = []
"""Pools and listeners inherited from a parent process: kept alive, never used (see
_get_pool)."""

_CONNECTIONS: weakref.WeakSet[psycopg.Connection[Any]] = weakref.WeakSet()
"""Every long-lived connection this module opened (pooled or listening)."""


def _set_up(conn: psycopg.Connection[Any]) -> None:
    """Pin the settings every statement of this module relies on, first thing on each
    connection, whatever the role, database or URL set: read committed (the server-side
    functions expect each statement to see what committed before it, after the locks it
    waited for) and a search path of pg_catalog alone (a function or operator another
    role created in a schema on the path, `public` say, would else be called in place
    of the built-in one by the statements sent from here and by the migrations)."""
    conn.execute(
        "SET search_path TO pg_catalog; SET default_transaction_isolation TO 'read committed'"
    )


def _stored_key(key: str) -> str:
    """The form of an idempotency key the keys table holds: a key with a NUL (text
    cannot hold one) or too long for its index is stored as its SHA-256. Replays are
    answered from the log, so only its uniqueness matters here."""
    if "\x00" in key or len(key) > 256:
        return "sha256:" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
    return key


def _neuter_inherited_connections() -> None:
    """In a forked child: point every inherited connection's socket at /dev/null.

    The socket is shared with the parent; if the child closed such a connection (a
    finalizer at exit, a pool closing), libpq would send the server a Terminate message
    and end the *parent's* session. Writing to /dev/null instead goes nowhere.
    """
    try:
        null = os.open(os.devnull, os.O_RDWR)
    except OSError:
        return
    try:
        for conn in list(_CONNECTIONS):
            try:
                fd = conn.pgconn.socket
            except psycopg.Error:
                continue  # already closed
            try:
                os.dup2(null, fd)
            except OSError:
                pass
    finally:
        os.close(null)
    _CONNECTIONS.clear()


process.at_fork(_neuter_inherited_connections)


def _live_cache(row: Sequence[Any]) -> tuple[Head, CacheReader] | None:
    """A row of `open_cache`'s statement as `open_cache` gives it: None unless the line
    at the cache's head is of the live log and has the `h` it was stored with."""
    log_id, seq, link, h, base_seq, size, data, line = row
    if line is None:
        return None
    try:
        if _head_decoder.decode(bytes(line).rstrip(b"\n")).h != h:
            return None
    except msgspec.MsgspecError:
        return None
    position = PgPosition(int(log_id), int(seq), int(size))
    head = Head(int(seq), link, h, position, int(size), int(base_seq))
    return head, BytesCacheReader(bytes(data))


_NO_HEAD = (None,) * 6  # a line's row of `read`: no head's columns


def _read_rows(
    head: Sequence[Any], snapshot: tuple[int, bytes] | None, lines: Iterable[bytes]
) -> list[tuple[Any, ...]]:
    """`read`'s rows (what `_read_result` takes) from a one-row statement's columns: the
    head's row, the opening snapshot's ((seq, line)), a row of each line."""
    rows: list[tuple[Any, ...]] = [(0, 0, *head, None)]
    if snapshot is not None:
        rows.append((1, snapshot[0], *_NO_HEAD, snapshot[1]))
    rows.extend((2, 0, *_NO_HEAD, line) for line in lines)
    return rows


def _remove_cache_parts_sql(q: str) -> str:
    """The statement of `remove_cache_parts` (the CASE: a name whose tail is no number
    is never cast)."""
    return (
        f"DELETE FROM {q}.caches c USING {q}.sessions s"
        f" WHERE c.sid = s.sid AND s.session_id = %s AND left(c.name, %s) = %s"
        f" AND CASE WHEN substr(c.name, %s) ~ '^[0-9]{{1,9}}$'"
        f" THEN substr(c.name, %s)::int >= %s ELSE false END"
    )


_LIVE_SIZE = "s.snap_len + s.stream_end - s.live_origin"  # (s: a sessions row)

ARRAY_BYTES = 64 << 20
"""The most bytes of lines a read takes in one array value of one row (a PostgreSQL
value holds at most 1 GB); past it the lines come a row each, in a statement of their
own. Read when an engine is made."""
# a head's columns, as `_head_of` reads them (s: a sessions row)
_HEAD_COLS = f"s.log_id, s.head_seq, s.head_link, s.head_h, s.base_seq, {_LIVE_SIZE}"


def _newest_snapshot(q: str) -> str:
    """The condition that a row `x` of `snapshots` is the session `s`'s newest (the
    snapshot its live log opens with, when it opens with one)."""
    return f"x.n = (SELECT max(y.n) FROM {q}.snapshots y WHERE y.sid = s.sid)"


class _Statements:
    """The SQL of one schema, built once (the schema name is the only spliced part)."""

    def __init__(self, q: str) -> None:
        # one statement (one snapshot): the head as the first row, then the live log's
        # opening snapshot (when reading from the start) and the lines after the position,
        # one row each (rows in binary: ~2x faster to fetch than one string_agg value)
        head_row = (
            f"WITH s AS (SELECT * FROM {q}.sessions WHERE session_id = %(sid)s)"
            f" SELECT 0 AS k, 0::bigint AS seq, {_HEAD_COLS}, NULL::bytea FROM s"
        )
        line_rows = (
            f"SELECT 2, l.seq, NULL, NULL, NULL, NULL, NULL, NULL, l.line FROM {q}.lines l, s"
            f" WHERE l.sid = s.sid AND"
        )
        self.read = (
            f"{head_row} UNION ALL"
            f" SELECT 1, s.snap_seq, NULL, NULL, NULL, NULL, NULL, NULL, coalesce(x.line, '')"
            f" FROM {q}.snapshots x, s"
            f" WHERE x.sid = s.sid AND s.snap_seq > 0 AND s.log_id <> %(log)s"
            f" AND {_newest_snapshot(q)}"
            f" UNION ALL {line_rows} l.seq > greatest(s.snap_seq,"
            f" CASE WHEN s.log_id = %(log)s THEN %(after)s ELSE 0 END)"
            f" ORDER BY 1, 2"
        )
        # `read` on from a position, one row: the head, then the lines after it in an
        # array if the live log is still the position's (NULL: it is not)
        self.read_on = (
            f"SELECT {_HEAD_COLS}, CASE WHEN s.log_id = %(log)s"
            f" AND {_LIVE_SIZE} - %(offset)s <= {ARRAY_BYTES} THEN ARRAY(SELECT l.line"
            f" FROM {q}.lines l WHERE l.sid = s.sid AND l.seq > %(after)s ORDER BY l.seq) END"
            f" FROM {q}.sessions s WHERE s.session_id = %(sid)s"
        )
        self.head = f"SELECT {_HEAD_COLS} FROM {q}.sessions s WHERE s.session_id = %s"
        self.session_row = f"SELECT sid, snap_seq, head_seq FROM {q}.sessions WHERE session_id = %s"
        self.snapshots_of = f"SELECT n, seq, line FROM {q}.snapshots WHERE sid = %s ORDER BY n"
        self._lines_statements(q)
        # the lines go in binary (`%b`): psycopg sends a list of bytes as a text array
        # otherwise, every byte hex-escaped (twice the bytes, ~27 us per 1.6 kB line to
        # dump, and the server's array_in to parse them back)
        self.append = (
            f"SELECT * FROM {q}.append(%s, %s, %s, %s, %b, %s, %s, %s, %s, %s, %s, %s::jsonb)"
        )
        self._index_statements(q)
        self.install = f"SELECT * FROM {q}.install_snapshot(%s, %s, %s, %s, %s, %s)"
        self.list_sessions = (
            f"SELECT session_id FROM {q}.sessions WHERE head_seq > 0 OR snap_seq > 0"
        )
        self.remove_lock = (
            f"SELECT sid, (head_seq > 0 OR snap_seq > 0) FROM {q}.sessions"
            f" WHERE session_id = %s FOR UPDATE"
        )
        self.remove = f"DELETE FROM {q}.sessions WHERE sid = %s"
        self.feed = f"SELECT * FROM {q}.feed(%s, %s)"
        self._cache_statements(q)
        self.legacy_position = (
            f"SELECT coalesce(max(feed_seq), 0) FROM {q}.lines"
            f" WHERE (tx, pos) <= (%s::text::xid8, %s) AND feed_seq IS NOT NULL"
        )
        # every open transaction older than the newest line held back holds it
        self.feed_blockers = (
            f"WITH held AS (SELECT max(l.tx) AS top FROM {q}.lines l"
            f" WHERE l.feed_seq IS NULL AND l.tx >= pg_snapshot_xmin(pg_current_snapshot())),"
            f" open AS (SELECT x FROM pg_snapshot_xip(pg_current_snapshot()) AS x, held"
            f" WHERE x < held.top)"
            f" SELECT o.x::text, a.pid, p.gid, a.datname, p.database, a.usename, p.owner,"
            f" a.state, a.xact_start, p.prepared"
            f" FROM open o"
            f" LEFT JOIN pg_stat_activity a ON a.backend_xid = xid(o.x)"
            f" LEFT JOIN pg_prepared_xacts p ON p.transaction = xid(o.x)"
            f" ORDER BY o.x"
        )
        self.lock_session = (
            f"SELECT sid, log_id, snap_seq, snap_len, live_origin, stream_end"
            f" FROM {q}.sessions WHERE session_id = %s FOR UPDATE"
        )
        self.live_snapshot = (
            f"SELECT line FROM {q}.snapshots WHERE sid = %s ORDER BY n DESC LIMIT 1"
        )
        self.held_head = f"SELECT head_seq, head_h, stream_end FROM {q}.sessions WHERE sid = %s"
        self.live_lines = (
            f"SELECT seq, stream_off, line FROM {q}.lines WHERE sid = %s AND seq > %s ORDER BY seq"
        )
        self.save = f"INSERT INTO {q}.saved (sid, reason, data) VALUES (%s, %s, %s) RETURNING n"
        self.replace_live_snapshot = (
            f"UPDATE {q}.snapshots SET line = %s, seq = %s WHERE sid = %s AND n ="
            f" (SELECT max(n) FROM {q}.snapshots WHERE sid = %s)"
        )
        self.insert_raw_line = (
            f"INSERT INTO {q}.lines (sid, seq, stream_off, line) VALUES (%s, %s, %s, %s)"
        )
        self.drop_lines_from = f"DELETE FROM {q}.lines WHERE sid = %s AND seq >= %s"
        self.drop_all_lines = f"DELETE FROM {q}.lines WHERE sid = %s"
        self.drop_snapshots = f"DELETE FROM {q}.snapshots WHERE sid = %s"
        self.drop_keys_after = f"DELETE FROM {q}.idempotency_keys WHERE sid = %s AND last_seq > %s"
        self.set_head = (
            f"UPDATE {q}.sessions SET log_id = nextval('{q}.log_ids'), head_seq = %s,"
            f" head_link = %s, head_h = %s, base_seq = %s, snap_seq = %s, snap_len = %s,"
            f" live_origin = %s, stream_end = %s WHERE sid = %s"
        )

    def _lines_statements(self, q: str) -> None:
        """The statements reading a session's lines by seq (`lines_at`) or all of them."""
        self.lines_of = f"SELECT seq, line FROM {q}.lines WHERE sid = %s ORDER BY seq"
        # lines by seq (`lines_at`), each with the last 25 bytes of the line before it
        # (b"" for the live log's first line; none for the first after a snapshot), of
        # the live log only (the lines a snapshot covers may be kept as its archive:
        # `l.seq - s.snap_seq > 0`, a filter the planner cannot take for the index's
        # range, which on a table not yet analyzed it took over the seqs asked for and
        # read every line of the session); the seqs go in binary (`%b`: a text array's
        # dumper compiles its quoting pattern on a process's first, ~0.2 ms)
        line = (
            "l.seq, l.line, s.snap_len + l.stream_off - s.live_origin,"
            " CASE WHEN p.seq IS NOT NULL THEN substring(p.line from octet_length(p.line) - 24)"
            " WHEN s.snap_len = 0 AND l.stream_off = s.live_origin THEN ''::bytea END"
        )
        before = f"{q}.lines p ON p.sid = s.sid AND p.seq = l.seq - 1 AND p.seq > s.snap_seq"
        self.lines_at = (
            f"SELECT {line} FROM {q}.sessions s JOIN {q}.lines l ON l.sid = s.sid"
            f" LEFT JOIN {before}"
            f" WHERE s.session_id = %s AND l.seq = ANY(%b::bigint[]) AND l.seq - s.snap_seq > 0"
        )
        # the head, with the newest %s lines (`tail`): a row each, or one with no line
        self.tail = (
            f"SELECT {_HEAD_COLS}, {line} FROM {q}.sessions s LEFT JOIN {q}.lines l"
            f" ON l.sid = s.sid AND l.seq > greatest(s.snap_seq, s.head_seq - %s)"
            f" AND l.seq <= s.head_seq LEFT JOIN {before} WHERE s.session_id = %s"
        )

    def _cache_statements(self, q: str) -> None:
        """The fold caches' statements (`PostgresEngine.open_cache` and the rest)."""
        # the line at the cache's head: a line of the live log, or its opening snapshot
        at_line = (
            f"CASE WHEN c.seq > s.snap_seq THEN"
            f" (SELECT l.line FROM {q}.lines l WHERE l.sid = s.sid AND l.seq = c.seq)"
        )
        at_head = (
            f"{at_line} WHEN c.seq = s.snap_seq THEN (SELECT x.line FROM {q}.snapshots x"
            f" WHERE x.sid = s.sid ORDER BY x.n DESC LIMIT 1) END"
        )
        cols = f"c.log_id, c.seq, c.link, c.h, c.base_seq, c.size, c.data, {at_head}"
        is_live = "c.log_id = s.log_id AND c.seq <= s.head_seq"
        cached = (
            f"SELECT c.name, {cols} FROM {q}.sessions s JOIN {q}.caches c"
            f" ON c.sid = s.sid AND c.name"
        )
        live = f" WHERE s.session_id = %s AND {is_live}"
        self.open_cache = f"{cached} = %s{live}"
        # one statement, one row: the cache's columns as `open_cache`'s, the head's, and
        # the lines after the cache's head in an array (NULL when more than %(ahead)s).
        # (Not a UNION of a row each, as `open_start` is: planned on a new server
        # session, the single row took ~0.9 ms less, and this is a cold load's first.)
        # A cache at the live log's opening snapshot is told by a flag, its line left
        # to `open_cache`'s own statement: the snapshots table named here cost ~0.2 ms
        # more (its catalog entries loaded, whether read or not).
        line_cols = cols.replace(at_head, f"{at_line} END")
        self.open_cache_on = (
            f"SELECT {line_cols}, {_HEAD_COLS}, CASE WHEN s.head_seq - c.seq <= %(ahead)s"
            f" AND {_LIVE_SIZE} - c.size <= {ARRAY_BYTES} THEN"
            f" ARRAY(SELECT l.line FROM {q}.lines l WHERE l.sid = s.sid AND l.seq > c.seq"
            f" ORDER BY l.seq) END, c.seq = s.snap_seq"
            f" FROM {q}.sessions s JOIN {q}.caches c ON c.sid = s.sid AND c.name = %(name)s"
            f" WHERE s.session_id = %(sid)s AND {is_live}"
        )
        # a fold with nothing in memory and no cache (`open_cold`), one statement, one
        # row (as `open_cache_on`'s): the mark's columns (NULL: none), the head's, then
        # the live log from its start, those only when at most %(ahead)s lines: its
        # opening snapshot's seq and line (NULL: it opens with none) and its lines
        ahead = f"CASE WHEN s.head_seq - s.base_seq < %(ahead)s AND {_LIVE_SIZE} <= {ARRAY_BYTES}"
        self.open_start = (
            f"SELECT {cols}, {_HEAD_COLS}, s.snap_seq, {ahead} AND s.snap_seq > 0 THEN"
            f" (SELECT coalesce(x.line, '') FROM {q}.snapshots x WHERE x.sid = s.sid"
            f" ORDER BY x.n DESC LIMIT 1) END, {ahead} THEN ARRAY(SELECT l.line"
            f" FROM {q}.lines l WHERE l.sid = s.sid AND l.seq > s.snap_seq ORDER BY l.seq) END"
            f" FROM {q}.sessions s LEFT JOIN {q}.caches c ON c.sid = s.sid"
            f" AND c.name = %(mark)s AND {is_live} WHERE s.session_id = %(sid)s"
        )
        self.open_cache_parts = f"{cached} = ANY(%s){live}"
        self.store_cache = (
            f"INSERT INTO {q}.caches (sid, name, log_id, seq, link, h, base_seq, size, data)"
            f" SELECT s.sid, %s, %s, %s, %s, %s, %s, %s, %s FROM {q}.sessions s"
            f" WHERE s.session_id = %s AND s.log_id = %s"
            f" ON CONFLICT (sid, name) DO UPDATE SET log_id = EXCLUDED.log_id,"
            f" seq = EXCLUDED.seq, link = EXCLUDED.link, h = EXCLUDED.h,"
            f" base_seq = EXCLUDED.base_seq, size = EXCLUDED.size, data = EXCLUDED.data"
        )
        self.remove_cache_parts = _remove_cache_parts_sql(q)

    def _index_statements(self, q: str) -> None:
        """The session index's statements (`PostgresEngine.index_page` and the rest)."""
        self.index_columns = (
            "session_id, created_us, updated_us, head_seq,"
            " CASE WHEN head_seq > 0 THEN head_seq - base_seq + 1 ELSE 0 END,"
            " snap_len + stream_end - live_origin, labels::text"
        )
        self.index_stale = f"SELECT 1 FROM {q}.meta WHERE name = 'index_stale'"
        self.index_fresh = f"DELETE FROM {q}.meta WHERE name = 'index_stale'"
        self.index_set = (
            f"UPDATE {q}.sessions SET created_us = %s, updated_us = greatest(updated_us, %s),"
            f" labels = %s::jsonb WHERE session_id = %s AND head_seq <= %s"
        )


def _end_seq(rows: list[Any], start: int) -> int | None:
    """The seq the rows of a read end at: the last line's own, the opening snapshot's,
    or `start` (where the read began) when there are none; None when the last line does
    not decode (the fold says what is wrong with it)."""
    if len(rows) == 1:
        return start
    last = rows[-1]
    if last[0] == 1:  # the opening snapshot: the session row's snap_seq
        return int(last[1])
    try:
        return _head_decoder.decode(last[8]).seq
    except msgspec.MsgspecError:
        return None


def _short_of_head(where: str, offset: int, end: int, head_seq: int) -> CorruptLogError:
    """The error of a live log whose rows end at `end`, not at the head's seq."""
    reason = f"the live log ends at seq {end} but its head is at seq {head_seq}"
    return CorruptLogError(where, offset, head_seq, reason)


def _checked_live(live: Segment | None, where: str, head_seq: int) -> Segment | None:
    """`live` (the live log's segment of a history, None: no rows), or an unreadable one
    when the seq its last line claims is not the head's (an undecodable last line is
    left to the reader of the segment, as `read` leaves it to the fold)."""
    data = live.read() if live is not None else b""
    if live is None and head_seq == 0:
        return None
    last = last_line_end(data) if data else None
    end = 0 if not data else None if last is None else last.seq
    if end is None or end == head_seq:
        return live
    return UnreadableSegment(data, where, _short_of_head(where, len(data), end, head_seq))


def _head_of(row: Any) -> Head:
    """A Head from (log_id, head_seq, head_link, head_h, base_seq, size)."""
    log_id, seq, link, h, base_seq, size = row[:6]
    if seq == 0 and size == 0:
        return EMPTY_HEAD
    return Head(
        seq=int(seq),
        link=link,
        h=h,
        position=PgPosition(int(log_id), int(seq), int(size)),
        size=int(size),
        base_seq=int(base_seq),
    )


def _seq_lines(rows: Iterable[Any]) -> dict[int, SeqLine]:
    """`lines_at`'s answer from rows of (seq, line, offset, the end of the line before):
    a line read whole (its newline) whose line before was found."""
    return {
        seq: SeqLine(bytes(line[:-1]), offset, bytes(before))
        for seq, line, offset, before in rows
        if before is not None and line.endswith(b"\n")
    }


def _split_keep(data: bytes) -> list[bytes]:
    """`data` cut after every newline (only newlines: a CR inside a line stays in it)."""
    parts = [x + b"\n" for x in data.split(b"\n")]
    parts[-1] = parts[-1][:-1]
    return [x for x in parts if x]


def _segments(where: str, snap_seq: int, snaps: list[Any], lines: list[Any]) -> list[Segment]:
    """Cut a session's rows into segments: archived segment i holds the snapshot that
    opened it (if kept) and the lines up to what snapshot i covers; the live log holds
    the last snapshot and the lines after it."""
    out: list[Segment] = []
    bounds = [int(s[1]) for s in snaps]
    li = 0
    opening: bytes | None = None
    start = 0
    for i, bound in enumerate(bounds):
        parts: list[bytes] = [opening] if opening else []
        first = start if opening else None
        while li < len(lines) and lines[li][0] <= bound:
            if first is None:
                first = int(lines[li][0])
            parts.append(bytes(lines[li][1]))
            li += 1
        if parts:
            out.append(BytesSegment(b"".join(parts), f"{where}@{i + 1}", True, first, bound))
        opening = bytes(snaps[i][2]) if snaps[i][2] is not None else None
        start = bound
    parts = [opening] if opening and snap_seq else []
    first = start if parts else None
    last: int | None = start if parts else None
    for seq, line in lines[li:]:
        if first is None:
            first = int(seq)
        last = int(seq)
        parts.append(bytes(line))
    if parts:
        out.append(BytesSegment(b"".join(parts), where, False, first, last))
    return out


class _PgRepairHold(RepairHold):
    """The session row locked in an open transaction; the live log read once."""

    def __init__(self, engine: PostgresEngine, conn: psycopg.Connection[Any], sid: str) -> None:
        self.engine = engine
        self.conn = conn
        self.session_id = sid
        self.where = engine.where(sid)
        sql = engine._sql
        row = conn.execute(sql.lock_session, (sid,)).fetchone()
        self.row = row
        self._lines: list[tuple[int, int, bytes]] = []
        self._snap = b""
        self._head_end: int | None = None
        if row is None:
            self._data = b""
            return
        key, _, snap_seq = row[0], row[1], row[2]
        if snap_seq:
            snap = conn.execute(sql.live_snapshot, (key,), binary=True).fetchone()
            self._snap = bytes(snap[0]) if snap and snap[0] is not None else b""
        self._lines = [
            (int(s), int(o), bytes(line))
            for s, o, line in conn.execute(sql.live_lines, (key, snap_seq), binary=True)
        ]
        self._data = self._snap + b"".join(line for _, _, line in self._lines)
        held = conn.execute(sql.held_head, (key,)).fetchone()  # (the row is locked)
        assert held is not None
        self._head_end = self._past_head(int(held[0]), held[1], int(held[2]))

    def _past_head(self, head_seq: int, head_h: str, stream_end: int) -> int | None:
        """Where the head's own lines end (its end of the stream), when rows past it
        follow them (inserted from outside: an append writes its lines and the head in
        one transaction), as `head_end`; None when there are none. Cut only when the
        head's own lines end at its line; a last line that is not the head's but
        claims a later seq (the head edited back over acknowledged lines) cannot be
        told apart from the head being right: CorruptLogError, whether rows follow or
        not (a repair that read the lines alone called such a log intact)."""
        ours = [got for got in self._lines if got[1] < stream_end]
        last = ours[-1][2] if ours else self._snap
        if link_ending(last[-LINE_END_LEN:]) == head_h:
            if len(ours) == len(self._lines):
                return None
            return len(self._snap) + sum(len(line) for _, _, line in ours)
        try:
            claims = _head_decoder.decode(last).seq
        except (msgspec.DecodeError, msgspec.ValidationError):
            claims = None  # (a damaged line: the repair of its lines says so)
        if len(ours) == len(self._lines) and (claims is None or claims <= head_seq):
            return None
        raise head_disputed(
            self.where,
            head_seq,
            f"its head is at seq {head_seq} but the live log's lines go on past it",
        )

    @property
    def head_end(self) -> int | None:
        return self._head_end

    @property
    def data(self) -> bytes:
        return self._data

    def keep_prefix(self, n: int, reason: str) -> str | None:
        if n == len(self._data):
            return None
        if not 0 <= n < len(self._data) or (n and self._data[n - 1 : n] != b"\n"):
            raise ValueError(f"{self.where}: {n} is not a line boundary of the live log")
        assert self.row is not None
        sql = self.engine._sql
        key, _, snap_seq, snap_len, live_origin, _ = self.row
        conn = self.conn
        name = self._save_aside(reason)
        if snap_seq and n < snap_len:
            # the opening snapshot itself goes: nothing before it can stay linked, so the
            # whole history is saved aside too and the session starts over empty
            with self.engine._history_on(conn, self.session_id) as hist:
                old = b"".join(seg.read() for seg in hist if seg.archived)
            if old:
                conn.execute(sql.save, (key, f"{reason}-history", old))
            conn.execute(sql.drop_all_lines, (key,))
            conn.execute(sql.drop_snapshots, (key,))
            conn.execute(sql.drop_keys_after, (key, 0))
            conn.execute(sql.set_head, (0, "", "", 0, 0, 0, 0, 0, key))
        else:
            kept_end = snap_len
            cut_seq: int | None = None
            last_line = self._snap if snap_seq else b""
            for seq, _, line in self._lines:
                if kept_end + len(line) > n:
                    cut_seq = seq
                    break
                kept_end += len(line)
                last_line = line
            assert cut_seq is not None
            conn.execute(sql.drop_lines_from, (key, cut_seq))
            head_seq, link, h = 0, "", ""
            if last_line:
                head_line = _head_decoder.decode(last_line)
                head_seq, h = head_line.seq, head_line.h
                link = (head_line.base_h or "") if head_line.type == "snapshot" else h
            conn.execute(sql.drop_keys_after, (key, head_seq))
            base_seq = snap_seq if snap_seq else (1 if head_seq else 0)
            stream_end = live_origin + kept_end - snap_len
            conn.execute(
                sql.set_head,
                (head_seq, link, h, base_seq, snap_seq, snap_len, live_origin, stream_end, key),
            )
        conn.execute("SELECT pg_notify(%s, %s)", (self.engine._channel, self.session_id))
        return name

    def _save_aside(self, reason: str) -> str:
        """Save the whole live log in `saved` (before any change); returns its name."""
        assert self.row is not None
        saved = self.conn.execute(self.engine._sql.save, (self.row[0], reason, self._data))
        row = saved.fetchone()
        return f"{self.where}/saved/{row[0] if row else '?'}-{reason}"

    def rewrite(self, data: bytes, reason: str) -> str:
        """Replace the live log's rows by the lines of `data`, numbered on from the live
        log's start (whatever seq they claim: a damaged log reads as damaged); when the
        live log opens with a snapshot, the first line of `data` replaces it (and its
        seq, when it says a later one). The original is saved aside first."""
        if self.row is None:
            raise KeyError(f"{self.where}: no live log to rewrite")
        sql = self.engine._sql
        key, _, old_snap, _, live_origin, _ = self.row
        conn = self.conn
        name = self._save_aside(reason)
        lines = _split_keep(data)
        snap_seq, snap = old_snap, b""
        if old_snap and lines:
            snap = lines.pop(0)
            snap_seq = max(old_snap, _seq_of(snap))
            conn.execute(sql.replace_live_snapshot, (snap, snap_seq, key, key))
        conn.execute(sql.drop_lines_from, (key, old_snap + 1))
        off = live_origin
        for i, line in enumerate(lines, 1):
            conn.execute(sql.insert_raw_line, (key, snap_seq + i, off, line))
            off += len(line)
        complete = [x for x in lines if x.endswith(b"\n")]
        head_seq, link, h = snap_seq + len(complete), "", ""
        try:
            last = _head_decoder.decode(complete[-1] if complete else snap)
            head_seq, h = last.seq, last.h
            link = (last.base_h or "") if last.type == "snapshot" else last.h
        except msgspec.MsgspecError:
            pass  # a damaged last line: the head's seq is where it stands
        base_seq = snap_seq or (1 if lines else 0)
        conn.execute(sql.drop_keys_after, (key, head_seq))
        conn.execute(
            sql.set_head,
            (head_seq, link, h, base_seq, snap_seq, len(snap), live_origin, off, key),
        )
        conn.execute("SELECT pg_notify(%s, %s)", (self.engine._channel, self.session_id))
        self._data = data
        return name


def _seq_of(line: bytes) -> int:
    """The seq a line claims (0 when it does not decode)."""
    try:
        return _head_decoder.decode(line.rstrip(b"\n")).seq
    except msgspec.MsgspecError:
        return 0


class _Listener:
    """One LISTEN connection per engine and process, on a daemon thread: counts the
    notifications per session so `wait` can block on a condition until one arrives.
    It registers as a follower (the schema's `listen()`) once listening, so appends
    notify; it is counted as listening only then (see `eventstore.engines.postgres.schema`).
    A role the server refuses that (a read-only role, a standby) would never be notified:
    the listener then lets its connection go and tries again after `LISTEN_RETRY`
    seconds (doubled each refusal, at most `LISTEN_RETRY_MAX`), and waiters poll."""

    def __init__(self, conninfo: str, channel: str, quoted_schema: str) -> None:
        self._conninfo = conninfo
        self._channel = channel
        self._q = quoted_schema
        self._cond = threading.Condition()
        self._counts: dict[str, int] = {}
        self._generation = 0  # bumped on every (re)connection: waiters then re-read
        self._listening = False
        self._refused = False  # the server refused to register it: waiters poll
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="eventstore-listen", daemon=True)
        self._thread.start()

    def mark(self, session_id: str, timeout: float) -> tuple[int, int] | None:
        """Where the notifications stand for a session, once LISTEN is active (None if it
        is not within a bounded wait: then the caller polls)."""
        with self._cond:
            self._cond.wait_for(
                lambda: self._listening or self._closed or self._refused, min(timeout, 2.0)
            )
            if not self._listening:
                return None
            return (self._generation, self._counts.get(session_id, 0))

    def wait_change(self, session_id: str, mark: tuple[int, int], timeout: float) -> bool:
        """Wait until a notification for the session (or a reconnection) after `mark`."""
        with self._cond:
            return self._cond.wait_for(
                lambda: self._closed or (self._generation, self._counts.get(session_id, 0)) != mark,
                max(timeout, 0.0),
            )

    def _run(self) -> None:
        retry = LISTEN_RETRY
        while not self._closed:
            refused = False
            try:
                with psycopg.connect(self._conninfo, autocommit=True) as conn:
                    _set_up(conn)
                    _CONNECTIONS.add(conn)
                    refused = not self._register(conn)
                    if not refused:
                        retry = LISTEN_RETRY
                        self._listen(conn)
            except psycopg.Error:
                pass
            with self._cond:
                self._listening = False
                self._generation += 1
                self._cond.notify_all()
                if refused:  # tried again later (or never: woken by close)
                    self._cond.wait_for(lambda: self._closed, retry)
                    retry = min(retry * 2, LISTEN_RETRY_MAX)
            if not self._closed and not refused:
                time.sleep(0.2)

    def _listen(self, conn: Any) -> None:
        """Count the notifications a registered connection gets until closed."""
        with self._cond:
            self._listening, self._refused = True, False
            self._generation += 1
            self._cond.notify_all()
        while not self._closed:
            got = False
            for note in conn.notifies(timeout=0.5):
                got = True
                with self._cond:
                    sid = note.payload
                    self._counts[sid] = self._counts.get(sid, 0) + 1
                    self._cond.notify_all()
            if not got:
                conn.execute("SELECT 1")  # notices a dead connection
        # closed: appends stop notifying once no one else follows (a
        # connection lost instead leaves its row to the next listen())
        conn.execute(f"SELECT {self._q}.unlisten()")

    def _register(self, conn: Any) -> bool:
        """LISTEN and register as a follower; False (and `_refused` set, waiters woken to
        poll) when the server refuses it: no right to write the listeners table, or a
        read-only server (tried again after `LISTEN_RETRY`: a grant, a promotion)."""
        try:
            conn.execute(f"LISTEN {self._channel}")
            conn.execute(f"SELECT {self._q}.listen()")
        except (psycopg.errors.InsufficientPrivilege, psycopg.errors.ReadOnlySqlTransaction):
            with self._cond:
                self._refused = True
                self._cond.notify_all()
            return False
        return True

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=2.0)


def init_db(url: str) -> tuple[int, int]:
    """Create or migrate the schema a URL names; returns (version before, version now)."""
    conninfo, schema = split_url(url)
    try:
        with psycopg.connect(conninfo, autocommit=True, connect_timeout=10) as conn:
            _set_up(conn)
            before = ensure_schema(conn, schema)
    except psycopg.Error as exc:
        text = _first_line(exc, secrets_of(url))
        raise StorageError(f"{redact_url(url)}: creating the schema failed: {text}") from None
    return before, SCHEMA_VERSION
