"""The file engine's session index: one SQLite file per store, `<root>/index.sqlite3`
(0600, WAL mode), a row per session (times, seq, size, labels) with B-tree indexes on
(updated, id) and (created, id), so a page is a range read, never a read of every log.

SQLite (the standard library's `sqlite3`) does what the index needs and a file of our
own would have to rebuild: atomic multi-process updates (its own locking, a busy wait
of `BUSY_MS`), a crash at any point leaving the last committed state, ordered range
reads. The index is a cache of the logs, never their authority:

- Written after each write's log (the new head; most appends' rows a little later, by
  `eventstore.engines.file.index_lag`) — except a session's first
  append, whose row is put in *before* its log is created (a "pending" row, `last_seq`
  0, committed with a full sync under `durability="fsync"`). So a crash at any point
  never leaves a session with a log and no row: at worst a row that is stale (the head
  moved and the row did not follow) or pending for a log that never came.
- A page checks each row it returns against its log (one `stat`: a row whose size is
  the log's is current) and corrects it (from the log's head, `updated` from its
  modification time) or drops it (no log), writing the correction back. So a stale
  row is corrected when a page reaches it; its place in the order is right from then.
- An update the index refuses (a locked or damaged file, a full disk) never fails the
  write (the log is committed): the engine leaves `index.stale` beside it and says so
  (a warning), and the next page rebuilds the index from the logs first
  (`SessionStore.rebuild_index`); so does a store whose logs predate its index (a
  release without it, or a process of one still writing: run `eventstore sessions
  ROOT --rebuild` after such a process wrote). A file found damaged (on opening it, or
  by a read or write after: a page that does not parse) is set aside as
  `index.sqlite3.damaged-<hex>`, never deleted, and made anew: its logs predate it. A
  row that does not parse marks the index stale; the page that read it reads every
  session instead.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from eventstore import entropy, process
from eventstore.engines.base import IndexEntry, IndexOrder, index_matches
from eventstore.engines.file.layout import LOG_NAME, SESSIONS_DIR, open_private
from eventstore.errors import StorageError, UnsafePathError
from eventstore.logger import INFO, WARNING, log

if TYPE_CHECKING:
    import sqlite3

__all__ = ["INDEX_NAME", "STALE_NAME", "FileIndex"]


INDEX_NAME = "index.sqlite3"
STALE_NAME = "index.stale"
BUSY_MS = 10_000
_BESIDE = ("-wal", "-shm", "-journal")  # the files SQLite keeps beside the index's
_CHUNK = 64  # rows read at a time while a page filters by label or drops stale rows

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    created INTEGER NOT NULL,
    updated INTEGER NOT NULL,
    last_seq INTEGER NOT NULL,
    events INTEGER NOT NULL,
    bytes INTEGER NOT NULL,
    labels TEXT NOT NULL DEFAULT '{}',
    deleted INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS sessions_updated ON sessions (updated, id);
CREATE INDEX IF NOT EXISTS sessions_created ON sessions (created, id);
"""

_UPSERT = (
    "INSERT OR REPLACE INTO sessions (id, created, updated, last_seq, events, bytes, labels,"
    " deleted) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
# an append's row: the times and labels a row has are kept unless the batch brings them
_UPSERT_APPEND = (
    "INSERT INTO sessions (id, created, updated, last_seq, events, bytes, labels)"
    " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET"
    " updated = max(updated, excluded.updated), last_seq = excluded.last_seq,"
    " events = excluded.events, bytes = excluded.bytes,"
    " labels = CASE WHEN ? THEN excluded.labels ELSE labels END,"
    " created = CASE WHEN last_seq = 0 THEN excluded.created ELSE created END"
)
_COLUMNS = "id, created, updated, last_seq, events, bytes, labels, deleted"
_ORDER_SQL = {
    "updated": ("(updated, id) < (?, ?)", "updated DESC, id DESC"),
    "created": ("(created, id) < (?, ?)", "created DESC, id DESC"),
    "id": ("id > ?", "id ASC"),
}
_labels_decoder = msgspec.json.Decoder(dict[str, str])


def _refused(exc: BaseException) -> bool:
    """Whether `exc` is the index refusing (an OSError, or any sqlite3 error: the module
    is imported on first use, ~10 ms a store that never pages or writes need not pay)."""
    mod = sys.modules.get("sqlite3")
    return isinstance(exc, OSError) or (mod is not None and isinstance(exc, mod.Error))


# SQLite's primary result codes for a file that is not (or no longer) a whole database
_SQLITE_CORRUPT, _SQLITE_NOTADB = 11, 26


def _damaged(exc: BaseException) -> bool:
    """Whether `exc` says the index file is damaged (a page that does not parse, or not
    a database at all), rather than refusing for now (locked, full, read-only)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(code, int) and code & 0xFF in (_SQLITE_CORRUPT, _SQLITE_NOTADB)


def _row(entry: IndexEntry) -> tuple[object, ...]:
    return (
        entry.session_id,
        entry.created_us,
        entry.updated_us,
        entry.last_seq,
        entry.events,
        entry.bytes,
        msgspec.json.encode(entry.labels).decode("utf-8") if entry.labels else "{}",
        int(entry.deleted),
    )


# what `_entry` raises for a row that does not parse
_UNPARSED = (ValueError, TypeError, msgspec.MsgspecError)


def _entry(row: tuple[object, ...]) -> IndexEntry:
    """The entry a row holds (ValueError, TypeError or a msgspec error: it does not
    parse, as a row another program wrote, or a flipped bit, may not)."""
    sid, created, updated, last_seq, events, size, labels, deleted = row
    if type(sid) is not str:
        raise ValueError(f"session id {sid!r} is not text")
    return IndexEntry(
        sid,
        int(created),  # type: ignore[call-overload]
        int(updated),  # type: ignore[call-overload]
        int(last_seq),  # type: ignore[call-overload]
        int(events),  # type: ignore[call-overload]
        int(size),  # type: ignore[call-overload]
        _labels_decoder.decode(str(labels)) if labels != "{}" else {},
        bool(deleted),
    )


class FileIndex:
    """The index of one store root; opened on first use, one connection per process
    (reset in a forked child), used by one thread at a time. `durable`: made to survive
    a power loss (a store with `durability="fsync"`); else made without a flush."""

    def __init__(self, root: Path, durable: bool = True) -> None:
        self.durable = durable
        self.path = root / INDEX_NAME
        self.stale_path = root / STALE_NAME
        self._root = root
        self._conn: sqlite3.Connection | None = None
        self._ident: tuple[int, int] | None = None  # (device, inode) of the file connected
        self._lock = threading.Lock()
        self._orphans: list[sqlite3.Connection] = []
        process.track(self)

    def reset_after_fork(self) -> None:
        """The parent's connection is never used (nor closed: SQLite forbids both) in a
        child: a fresh one opens on use."""
        self._lock = threading.Lock()
        if self._conn is not None:
            self._orphans.append(self._conn)
        self._conn = None

    def close(self) -> None:
        """Close the connection (it reopens on use)."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    # -- the connection ------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        """The connection, opened (and the file created 0600, the schema made) when
        first needed. A store whose sessions predate the file is marked stale."""
        if self._conn is not None:
            return self._conn
        unsafe = self._planted()
        if unsafe is not None:
            self._set_aside(unsafe)
        created = False
        try:
            os.close(open_private(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL))
            created = True
        except FileExistsError:
            pass
        import sqlite3  # here: see `_refused`

        try:
            conn = self._open()
        except sqlite3.DatabaseError as exc:
            self._set_aside(exc)  # not an index (damaged, or another file)
            os.close(open_private(self.path, os.O_RDWR | os.O_CREAT))
            conn = self._open()
            created = True
        if created and _has_sessions(self._root):
            # expected (a store from a release without the index, a restored copy): no warning
            self.mark_stale("the store's logs predate its index", level=INFO)
        st = os.stat(self.path)
        self._conn, self._ident = conn, (st.st_dev, st.st_ino)
        return conn

    def _planted(self) -> str | None:
        """Why the index's file, or one SQLite keeps beside it (`_BESIDE`), is not one
        SQLite may write through (a symlink or another non-file planted at its name, or
        a file with a second name, such as a hard link to someone else's database);
        None: nothing wrong there. SQLite opens those names itself, following links."""
        for name in (str(self.path), *(f"{self.path}{s}" for s in _BESIDE)):
            try:
                st = os.lstat(name)
            except FileNotFoundError:
                continue
            if not stat.S_ISREG(st.st_mode):
                return f"{name} is not a regular file; eventstore never follows links in a store"
            if st.st_nlink != 1:
                return f"{name} has {st.st_nlink} names; eventstore writes no file it shares"
        return None

    def _set_aside(self, why: object) -> None:
        """Move the index file (and those beside it) aside, never deleted: a new one is
        made on the next use, which finds the logs older than it and rebuilds from them.
        A link is moved itself, never what it points at."""
        aside = self.path.with_name(f"{INDEX_NAME}.damaged-{entropy.token_hex(4)}")
        log.warning("eventstore: %s: not a session index (%s): moved to %s",
                    self.path, why, aside.name)  # fmt: skip
        for suffix in ("", *_BESIDE):
            with contextlib.suppress(FileNotFoundError):
                os.replace(f"{self.path}{suffix}", f"{aside}{suffix}")

    def _refusal(self, exc: BaseException) -> bool:
        """Whether `exc` is the index refusing (`_refused`). A file found damaged after
        it opened (a page that does not parse) is let go and set aside first, unless
        another process did already (the name then holds the index it made)."""
        if not _refused(exc):
            return False
        if _damaged(exc):
            with self._lock:
                conn, self._conn = self._conn, None
                if conn is not None:
                    conn.close()
                with contextlib.suppress(FileNotFoundError):
                    st = os.stat(self.path)
                    if (st.st_dev, st.st_ino) == self._ident:
                        self._set_aside(exc)
        return True

    def _open(self) -> sqlite3.Connection:
        import sqlite3

        conn = sqlite3.connect(
            self.path, timeout=BUSY_MS / 1000, isolation_level=None, check_same_thread=False
        )
        try:
            conn.execute(f"PRAGMA busy_timeout = {BUSY_MS}")
            if not self.durable:
                # a store whose appends survive a killed process, not a power loss: its
                # index is made without a flush (the switch to WAL and the schema flush
                # six times, ~5 ms of the first append to a new store)
                conn.execute("PRAGMA synchronous = OFF")
            conn.execute("PRAGMA journal_mode = WAL")
            if self.durable:
                conn.execute("PRAGMA synchronous = NORMAL")
            conn.executescript(_SCHEMA)
            if not self.durable:
                conn.execute("PRAGMA synchronous = NORMAL")
        except BaseException:
            conn.close()
            raise
        return conn

    @contextlib.contextmanager
    def _tx(self, busy_ms: int | None = None) -> Iterator[sqlite3.Connection]:
        """A write transaction, waiting `busy_ms` (None: `BUSY_MS`) for a locked index."""
        conn = self._connect()
        if busy_ms is not None:
            conn.execute(f"PRAGMA busy_timeout = {int(busy_ms)}")
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        finally:
            if busy_ms is not None:
                conn.execute(f"PRAGMA busy_timeout = {BUSY_MS}")

    # -- what writes do ------------------------------------------------------------------

    def mark_stale(self, why: str, *, level: int = WARNING) -> None:
        """Leave the marker that makes the next page rebuild the index first (said at
        `level`; a marker that cannot be left is always a warning)."""
        try:
            fd = self._open_marker()
            try:
                os.utime(fd)  # now: a rebuild that began before this must not lift it
            finally:
                os.close(fd)
        except (OSError, UnsafePathError) as exc:
            log.warning("eventstore: %s: cannot mark the index stale (%s): %s",
                        self.stale_path, why, exc)  # fmt: skip
        else:
            log.log(level, "eventstore: %s: the session index is stale (%s); the next page"
                    " rebuilds it", self.path, why)  # fmt: skip

    def _open_marker(self) -> int:
        """The stale marker, opened to write (made if missing). Anything but a file or a
        directory at its name (a planted link, a FIFO) is removed first, never what a
        link points at, so the marker is left."""
        flags = os.O_WRONLY | os.O_CREAT
        with contextlib.suppress(FileNotFoundError):
            mode = os.lstat(self.stale_path).st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                os.unlink(self.stale_path)
                flags |= os.O_EXCL
        return open_private(self.stale_path, flags)

    def put(self, entry: IndexEntry, *, sync: bool = False) -> None:
        """Write a session's row; a refusal marks the index stale, never raises."""
        try:
            with self._lock:
                conn = self._connect()
                if sync:
                    conn.execute("PRAGMA synchronous = FULL")
                try:
                    conn.execute(_UPSERT, _row(entry))
                finally:
                    if sync:
                        conn.execute("PRAGMA synchronous = NORMAL")
        except Exception as exc:
            if not self._refusal(exc):
                raise
            self.mark_stale(f"writing {entry.session_id!r}: {exc}")

    def put_appended(
        self, entries: Sequence[tuple[IndexEntry, bool]], *, busy_ms: int | None = None
    ) -> None:
        """Write appends' rows in one transaction (each with whether its batch set the
        labels), waiting `busy_ms` (None: `BUSY_MS`) for a locked index; a refusal marks
        the index stale, never raises."""
        rows = [(*_row(e)[:7], with_labels) for e, with_labels in entries]
        # the wait covers this process's other threads too: one writing a row, itself
        # held up by another process's lock, holds `_lock` for the whole busy timeout
        if not self._lock.acquire(timeout=-1 if busy_ms is None else busy_ms / 1000):
            self.mark_stale(f"writing {len(rows)} rows: another thread holds the index")
            return
        try:
            try:
                with self._tx(busy_ms) as conn:
                    conn.executemany(_UPSERT_APPEND, rows)
            finally:
                self._lock.release()  # (before `_refusal`, which may take it)
        except Exception as exc:
            if not self._refusal(exc):
                raise
            self.mark_stale(f"writing {len(rows)} rows: {exc}")

    def get(self, session_id: str) -> IndexEntry | None:
        """A session's row (None: none, or the index cannot be read)."""
        try:
            with self._lock:
                row = (
                    self._connect()
                    .execute(f"SELECT {_COLUMNS} FROM sessions WHERE id = ?", (session_id,))
                    .fetchone()
                )
        except Exception as exc:
            if not self._refusal(exc):
                raise
            self.mark_stale(f"reading {session_id!r}: {exc}")
            return None
        if row is None:
            return None
        try:
            return self._parsed(row)
        except StorageError:
            return None  # (marked stale: the next page rebuilds)

    def drop(self, session_id: str) -> None:
        """Remove a session's row; a refusal marks the index stale."""
        try:
            with self._lock:
                self._connect().execute("DELETE FROM sessions WHERE id = ?", (session_id,))
        except Exception as exc:
            if not self._refusal(exc):
                raise
            self.mark_stale(f"dropping {session_id!r}: {exc}")

    # -- what pages do -------------------------------------------------------------------

    def stale(self) -> bool:
        """Whether the index may lack a session (the marker is there)."""
        try:
            with self._lock:
                self._connect()
        except Exception as exc:
            if not self._refusal(exc):
                raise
            raise StorageError(f"{self.path}: the session index cannot be opened: {exc}") from exc
        return os.path.lexists(self.stale_path)

    def rows(
        self,
        order: IndexOrder,
        after: IndexEntry | None,
        prefix: str | None,
        updated_since_us: int | None,
        labels: dict[str, str],
    ) -> Iterator[IndexEntry]:
        """The rows after `after` in `order` passing the filters, read `_CHUNK` at a
        time (a consumer stops when its page is full)."""
        cursor_sql, order_sql = _ORDER_SQL[order]
        while True:
            where: list[str] = []
            args: list[object] = []
            if after is not None:
                where.append(cursor_sql)
                args += [after.session_id] if order == "id" else list(after.sort_key(order))
            if prefix:
                where.append("substr(id, 1, ?) = ?")
                args += [len(prefix), prefix]
            if updated_since_us is not None:
                where.append("updated >= ?")
                args.append(updated_since_us)
            sql = f"SELECT {_COLUMNS} FROM sessions"
            if where:
                sql += " WHERE " + " AND ".join(where)
            sql += f" ORDER BY {order_sql} LIMIT {_CHUNK}"
            try:
                with self._lock:
                    got = self._connect().execute(sql, args).fetchall()
            except Exception as exc:
                if not self._refusal(exc):
                    raise
                raise StorageError(f"{self.path}: reading the session index failed: {exc}") from exc
            for row in got:
                entry = self._parsed(row)
                if index_matches(entry, prefix, updated_since_us, labels):
                    yield entry
            if len(got) < _CHUNK:
                return
            after = self._parsed(got[-1])

    def _parsed(self, row: tuple[object, ...]) -> IndexEntry:
        """The entry of `row`; one that does not parse marks the index stale and is a
        StorageError (a page then reads every session; the next rebuilds the index)."""
        try:
            return _entry(row)
        except _UNPARSED as exc:
            self.mark_stale(f"a row does not parse: {exc}")
            raise StorageError(f"{self.path}: a row of the session index does not parse:"
                               f" {exc}") from exc  # fmt: skip

    def replace(self, entries: Sequence[IndexEntry], started_us: int) -> None:
        """Merge a rebuild (see `IndexingEngine.replace_index`), then lift the stale
        marker if nothing marked it since the rebuild began."""
        given = {e.session_id: e for e in entries}
        try:
            self._merge(given, started_us)
        except Exception as exc:
            if not self._refusal(exc):
                raise
            raise StorageError(f"{self.path}: rebuilding the session index failed: {exc}") from exc
        try:
            st = os.lstat(self.stale_path)
        except FileNotFoundError:
            return
        if st.st_mtime_ns // 1000 < started_us:
            # (a marker that cannot be lifted, such as a directory planted at its name,
            # stays: each page rebuilds, as slow as a scan, never wrong)
            with contextlib.suppress(OSError):
                os.unlink(self.stale_path)

    def _merge(self, given: dict[str, IndexEntry], started_us: int) -> None:
        with self._lock, self._tx() as conn:
            for row in conn.execute(f"SELECT {_COLUMNS} FROM sessions").fetchall():
                try:
                    have = _entry(row)
                except _UNPARSED:
                    # a row that does not parse: the logs' (below) replaces it, if any
                    conn.execute("DELETE FROM sessions WHERE id = ?", (row[0],))
                    continue
                mine = given.get(have.session_id)
                if mine is None:
                    if have.updated_us < started_us:
                        conn.execute("DELETE FROM sessions WHERE id = ?", (have.session_id,))
                elif have.last_seq > mine.last_seq:
                    del given[have.session_id]  # written since the rebuild read it
            conn.executemany(_UPSERT, [_row(e) for e in given.values()])


def _has_sessions(root: Path) -> bool:
    """Whether any session under `root` has a log (stops at the first)."""
    try:
        with os.scandir(root / SESSIONS_DIR) as it:
            return any(os.path.lexists(os.path.join(e.path, LOG_NAME)) for e in it)
    except FileNotFoundError:
        return False
