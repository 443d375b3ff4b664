"""The file engine: one JSON Lines file per session under a store root (the on-disk format
of every release; see `eventstore.engines.file.layout` for where files live).

Readers take no lock: they read from their position to the end of the file and return
complete batches only (a long log piece by piece, `read_some`). Writers take an exclusive
lock on `log.lock` (not the log: a snapshot install replaces the log) — the `flock` that
portalocker takes, taken directly — check the head, set aside and cut a torn tail (with
a warning), append one batch in one `write`, and release.

The writer fast path: each session's lock-file and log descriptors stay open between
appends (at most `MAX_OPEN_SESSIONS` sessions, reset in a forked child). The lock file
holds a generation number that every replacer of the log (snapshot install, repair,
removal) bumps under the lock before replacing anything; a writer that finds the
generation it cached and the log size it left appends with no path lookup and no tail
read (see `_Session`).

Under `durability="fsync"` an append is made durable through `log.journal`, a mirror of
the log's last appends that is flushed instead of the growing log, and copied back after
a power loss before the session is read (`eventstore.engines.file.journal`).

`fold-<projection>.cache` beside the log is the face's fold cache (`open_cache`,
`store_cache`; format in `eventstore.core.fold_cache`): the engine adds where in the log it
was folded to and gives it back only while that point is still in the live log.

A snapshot is installed
by writing the new log to a temporary file, fsyncing it, hard-linking the old log into
`archive/<first>-<last>.jsonl.pending`, renaming the new log over the old, and giving the
archive link its final name:

1. a crash before the rename leaves the old log (plus a temporary file and a pending link
   to the live log, which the next install removes);
2. after it, the new log (and a pending link to the old log, which the next install names).

There is never a moment without a complete log. Readers notice the new file identity
(device, inode and the hash before their position) and re-read from the start.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import stat
import sys
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec

from eventstore.engines.base import (
    EMPTY_HEAD,
    CacheReader,
    Durability,
    EncodedBatch,
    Engine,
    Head,
    HeadMovedError,
    History,
    InstallResult,
    LiveView,
    Position,
    PrunedSegment,
    ReadResult,
    RepairHold,
    Segment,
)
from eventstore.engines.file import journal as file_journal
from eventstore.engines.file.journal import NotAJournalError
from eventstore.engines.file.layout import (
    TMP_MARK,
    SessionPaths,
    datasync,
    ensure_private_dir,
    fsync_dir,
    list_session_ids,
    open_private,
    pread_all,
    pwrite_all,
    validate_session_id,
    write_all,
    write_atomically,
)
from eventstore.errors import (
    CorruptLogError,
    EventStoreError,
    StorageError,
    UnsafePathError,
)
from eventstore.format.events import (
    HASH_SUFFIX_LEN,
    SNAPSHOT_OPEN,
    LineHead,
    SnapshotHead,
    damaged_newline,
    find_snapshot_head,
)

__all__ = ["FileEngine", "FilePosition", "from_url"]

log = logging.getLogger("eventstore")

_TAIL_CHUNK = 1 << 13
# compaction adds "-<hex>" when it archives the same range twice (a re-compacted snapshot)
ARCHIVE_NAME = re.compile(r"(\d{12})-(\d{12})(?:-[0-9a-f]+)?\.jsonl(\.pending)?\Z")
_PENDING = ".pending"
_OLD_TMP_PREFIX = "log.jsonl.compact-"  # temporary files of releases before 0.2
_REMOVED_PREFIX = ".removed-"  # a session being removed: never an id (ids cannot start with ".")
_HISTORY_TRIES = 50  # lock-free pictures spoiled by installs before a reader takes the lock
_head_decoder = msgspec.json.Decoder(LineHead)


def _storage_error(path: object, doing: str, exc: OSError) -> Exception:
    if isinstance(exc, EventStoreError):
        return exc
    return StorageError(f"{path}: {doing} failed: {exc.strerror or exc}", exc.errno)


class FilePosition(msgspec.Struct, Position, frozen=True):
    """Where a read of one log file ended: the file (device, inode), the byte after the
    last complete batch, and that batch's last line (seq, link, `h`: the `h` proves the
    file is still the one read, even if its inode number was reused). `seen`: the size
    of the file when read (a torn tail included), which `wait` compares against; it is
    not part of the place, so positions that differ only in it are equal.

    A frozen msgspec Struct (every append builds one, about 6x faster than a frozen
    dataclass).
    """

    ident: tuple[int, int]
    offset: int
    seq: int
    link: str
    h: str
    base_seq: int
    seen: int = 0

    def __eq__(self, other: object) -> bool:
        if type(other) is not FilePosition:
            return NotImplemented
        return (
            self.offset == other.offset
            and self.ident == other.ident
            and self.h == other.h
            and self.seq == other.seq
            and self.link == other.link
            and self.base_seq == other.base_seq
        )

    def __hash__(self) -> int:
        return hash((self.ident, self.offset, self.seq, self.link, self.h, self.base_seq))

    def head(self) -> Head:
        """The head this position is just after."""
        return Head(self.seq, self.link, self.h, self, self.offset, self.base_seq)


def _head_at(ident: tuple[int, int], offset: int, line: LineHead, base_seq: int, seen: int) -> Head:
    link = (line.base_h or "") if line.type == "snapshot" else line.h
    return FilePosition(ident, offset, line.seq, link, line.h, base_seq, seen).head()


class _Session:
    """What the engine keeps per session in this process.

    The writer fast path: the lock file's and the log's descriptors stay open between
    calls (`lock_fd`, `log_fd`; -1 when closed), so an append is flock, one `pread` of
    the lock file's generation, one `fstat` of the log, the write and the unlock. Every
    replacer of the log (snapshot install, repair, removal) bumps the generation under
    the lock *before* it replaces anything, so a writer that finds the generation it
    cached knows its descriptors still name the live files, and one that finds the size
    it left knows nobody appended since. Only code holding `lock` touches the
    descriptors, which is why eviction and close never close one a writer is using.

    Under `durability="fsync"` also the journal's (`journal_fd`), the epoch its mirror
    is in as this process last found it (`epoch`), and the lock file's hints as the
    last lock found them (`head`: its first bytes; see `eventstore.engines.file.journal`).
    """

    __slots__ = (
        "epoch",
        "gen",
        "head",
        "journal_fd",
        "known",
        "lock",
        "lock_fd",
        "log_fd",
        "log_link",
        "paths",
    )

    def __init__(self, paths: SessionPaths) -> None:
        self.paths = paths
        # spares threads of one process from spinning on the file lock, and guards the
        # cached descriptors (threads of one process share them, and flock does not
        # exclude two users of one open file description)
        self.lock = threading.Lock()
        # where the last writer of this process left the file: when the file has not
        # changed since, the next writer needs no tail read at all
        self.known: Head | None = None
        self.lock_fd = -1
        self.log_fd = -1
        self.journal_fd = -1
        self.gen = b""  # the lock file's generation when lock_fd was last validated
        self.head = b""  # the lock file's first bytes, as the last lock read them
        self.epoch: file_journal.Epoch | None = None
        # where the kernel says log_fd's file is (the fsync fast path: see _fd_path)
        self.log_link: str | None = None

    def drop_log_fd(self) -> None:
        """Close the cached log descriptor (the log was replaced, or is being)."""
        fd, self.log_fd = self.log_fd, -1
        self.known = None
        self.epoch = None  # an epoch mirrors one log
        self.log_link = None
        if fd >= 0:
            _close_quietly(fd)

    def drop_fds(self) -> None:
        """Close every cached descriptor (caller holds `lock`, or is a forked child)."""
        self.drop_log_fd()
        fds = (self.lock_fd, self.journal_fd)
        self.lock_fd = self.journal_fd = -1
        for fd in fds:
            if fd >= 0:
                _close_quietly(fd)

    def __del__(self) -> None:
        # an engine (a store) dropped without close() must not leak its descriptors:
        # its sessions go with it (nothing else refers to them), and theirs close here
        self.drop_fds()


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


# the same OS lock portalocker takes on POSIX (fcntl.flock on the lock file's
# descriptor; `tests/test_fastpath.py` proves the two exclude each other across
# processes), without its per-call Python wrapper (~7 us) and without importing it
# (its metadata lookup costs ~18 ms of `import`). Elsewhere portalocker does it.
if sys.platform != "win32":
    import fcntl

    def _lock_exclusive(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_EX)

    def _unlock(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_UN)

else:  # pragma: no cover - Windows

    def _lock_exclusive(fd: int) -> None:
        import portalocker

        portalocker.lock(fd, portalocker.LockFlags.EXCLUSIVE)

    def _unlock(fd: int) -> None:
        import portalocker

        portalocker.unlock(fd)


_GEN_BYTES = 8  # the generation: a big-endian counter at the start of the lock file
# what a lock reads of the lock file: the generation and the journal's hints after it
_LOCK_HEAD = file_journal.HINTS_AT + 16
MAX_OPEN_SESSIONS = 64
"""Sessions per engine whose descriptors stay open between calls (two each)."""

_engines: weakref.WeakSet[FileEngine] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # a lock held by another thread of the parent at the fork is held forever in the
    # child: give the child fresh ones. The cached descriptors are the parent's open file
    # descriptions, and flock does not exclude two users of one description: the child
    # closes its copies (the parent's lock, if held, stays with the parent's copy) and
    # opens its own
    for engine in list(_engines):
        engine._reset_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class FileEngine(Engine):
    """Sessions as JSON Lines files under `root` (created 0700 if missing)."""

    def __init__(self, root: str | os.PathLike[str], durability: Durability = "flush") -> None:
        if durability not in ("flush", "fsync"):
            raise ValueError(f"durability must be 'flush' or 'fsync', not {durability!r}")
        self.root = Path(root)
        self.durability: Durability = durability
        self.url = os.fspath(self.root)
        _ensure_root(self.root)
        self._sessions: dict[str, _Session] = {}
        # sessions with descriptors open, least recently opened first (bounded)
        self._open: dict[str, _Session] = {}
        self._guard = threading.Lock()
        _engines.add(self)

    def _reset_after_fork(self) -> None:
        self._guard = threading.Lock()
        for sess in self._sessions.values():
            sess.drop_fds()
        self._sessions = {}
        self._open = {}

    def _session(self, session_id: str) -> _Session:
        sess = self._sessions.get(session_id)
        if sess is None:
            validate_session_id(session_id)
            fresh = _Session(SessionPaths(self.root, session_id))
            self._settle(fresh)  # before any read or write of it in this process
            with self._guard:
                sess = self._sessions.setdefault(session_id, fresh)
        return sess

    def _settle(self, sess: _Session) -> None:
        """Copy back into the log the acknowledged appends a power loss took from it and
        its journal kept (`file_journal.lacking`). Looked for without a lock (a session
        whose log lacks nothing, the usual case, costs the look: no journal, or a read
        of its mirror and the log's tail), copied under the writers' lock."""
        paths = sess.paths
        try:
            paths.check_no_links()
            found = _lacking(paths, os.O_RDONLY)
            if found is None:
                return
            os.close(found[0])
            with self._locked(sess, create=False) as exists:
                found = _lacking(paths, os.O_RDWR) if exists else None
                if found is not None:
                    self._copy_back(sess, *found)
        except UnsafePathError:
            return  # a planted link: every operation that uses the path refuses it
        except OSError as exc:
            # not settled: this use fails, and the next one looks again. Going on would
            # let the next append cut what the journal alone still holds
            raise StorageError(
                f"{paths.journal}: checking the log against the journal after a crash"
                f" failed: {exc.strerror or exc}; nothing was changed, try again",
                exc.errno,
            ) from exc

    def _copy_back(self, sess: _Session, fd: int, at: int, data: bytes) -> None:
        """Write `data` into the log open at `fd` from byte `at` (what it overwrites, a
        torn line or zeros, kept beside the log as a torn tail is) and flush it (writers'
        lock held)."""
        try:
            size = os.fstat(fd).st_size
            if size > at:
                _save_aside(
                    sess.paths.log, "torn", pread_all(fd, min(size, at + len(data)) - at, at)
                )
            pwrite_all(fd, data, at)
            datasync(fd)
        finally:
            os.close(fd)
        sess.known = None
        log.warning(
            "eventstore: %s: copied back %d bytes of acknowledged appends at byte %d from"
            " the journal (the log had lost them: a power loss)",
            sess.paths.log,
            len(data),
            at,
        )

    # -- locking ----------------------------------------------------------------------

    def _acquire(self, sess: _Session, create: bool) -> bool:
        """Take the session's writers' lock (the caller holds `sess.lock`); False, holding
        nothing, when the session directory does not exist and `create` is False.

        Fast: the cached lock descriptor, and the generation it had. Slow (first use, or
        the generation moved): open the lock file at its path; the lock file lives in
        the session directory, which `remove_session` renames away, so after locking it
        must still be the one at the path, else the session was removed meanwhile and
        the lock is taken again on the new one.
        """
        fd = sess.lock_fd
        if fd >= 0:
            _lock_exclusive(fd)
            try:
                head = os.pread(fd, _LOCK_HEAD, 0)
                if head[:_GEN_BYTES] == sess.gen:
                    sess.head = head
                    return True
            except BaseException:
                _unlock(fd)
                raise
            _unlock(fd)
            sess.drop_fds()  # replaced or removed since: reopen at the path
        paths = sess.paths
        while True:
            try:
                if create:
                    paths.create()
                else:
                    paths.check_no_links()
                    if not os.path.lexists(paths.dir):
                        return False
                fd = open_private(paths.lock, os.O_RDWR | os.O_CREAT)
            except FileNotFoundError:
                continue  # the directory was removed between create and open
            except OSError as exc:
                raise _storage_error(paths.lock, "opening the lock file", exc) from exc
            try:
                _lock_exclusive(fd)
                if _same_file(fd, paths.lock):
                    sess.head = os.pread(fd, _LOCK_HEAD, 0)
                    sess.gen = sess.head[:_GEN_BYTES]
                    sess.lock_fd = fd
                    self._remember(sess)
                    return True
                _unlock(fd)
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)
            sess.known = None  # the session was removed while we waited

    def _remember(self, sess: _Session) -> None:
        """Count `sess` among the sessions with open descriptors; past the bound, close
        the oldest others' (skipping any a thread is using: their `lock` is held)."""
        with self._guard:
            self._open.pop(sess.paths.session_id, None)
            self._open[sess.paths.session_id] = sess
            if len(self._open) <= MAX_OPEN_SESSIONS:
                return
            for sid, other in list(self._open.items()):
                if len(self._open) <= MAX_OPEN_SESSIONS:
                    break
                if other is sess or not other.lock.acquire(blocking=False):
                    continue
                try:
                    other.drop_fds()
                finally:
                    other.lock.release()
                del self._open[sid]

    def _bump_generation(self, sess: _Session, *, retire: bool = True) -> None:
        """Tell every process's cached descriptors that the log is being replaced (the
        writers' lock is held). Called before the replacing step: a crash after it
        costs others one reopen; the other order could leave them writing to a file
        that is no longer the log. `retire`: the journal's epoch goes with the log being
        replaced (see `_retire_journal`); a removal, which takes the journal with it,
        passes False."""
        if retire:
            self._retire_journal(sess)
        gen = (int.from_bytes(os.pread(sess.lock_fd, _GEN_BYTES, 0), "big") + 1) % (1 << 64)
        # the journal's hints, where there are any, go with the log being replaced: no
        # epoch mirrors the next one (a lock file without hints stays 8 bytes)
        hints = (0, 0) if len(sess.head) > _GEN_BYTES else None
        self._write_lock_head(sess, gen.to_bytes(_GEN_BYTES, "big"), hints)
        sess.drop_log_fd()

    @staticmethod
    def _write_lock_head(sess: _Session, gen: bytes, hints: tuple[int, int] | None) -> None:
        """Write the lock file's first bytes (writers' lock held): the generation and,
        unless None, the journal's hints (epoch, mirrored end). Raises OSError."""
        head = gen + file_journal.pack_hints(*hints) if hints is not None else gen
        if os.pwrite(sess.lock_fd, head, 0) != len(head):
            raise OSError(f"{sess.paths.lock}: short write of its generation and hints")
        sess.gen, sess.head = gen, head

    def _retire_journal(self, sess: _Session) -> None:
        """End the journal's epoch before the log is replaced (writers' lock held): the
        log is flushed (what only the mirror held is then durable in it), then the
        header is cleared and flushed. Else a replacement that cuts the log short (a
        repair) would have the lines it dropped copied back after a crash, the content
        check finding the line before the epoch still in place."""
        paths = sess.paths
        if len(sess.head) > _GEN_BYTES:
            # first no writer may go on mirroring (the hints name the epoch): if this
            # fails, the epoch stays whole, and so does everything it mirrors
            self._write_lock_head(sess, sess.gen, (0, 0))
        if sess.journal_fd < 0 and not os.path.lexists(paths.journal):
            return
        fd = sess.journal_fd if sess.journal_fd >= 0 else file_journal.open_journal(paths.journal)
        try:
            if file_journal.read_epoch(fd) is None:
                return
            log_fd, _ = _open_existing(paths.log)
            if log_fd is not None:
                try:
                    datasync(log_fd)
                finally:
                    os.close(log_fd)
            file_journal.retire(fd)
        finally:
            if fd != sess.journal_fd:
                os.close(fd)
        sess.epoch = None

    @contextmanager
    def _locked(self, sess: _Session, *, create: bool = True) -> Iterator[bool]:
        """`_acquire` as a context manager, for the paths that are not hot."""
        with sess.lock:
            if not self._acquire(sess, create):
                yield False
                return
            try:
                yield True
            finally:
                _unlock(sess.lock_fd)

    # -- reading ----------------------------------------------------------------------

    def read(self, session_id: str, position: Position | None) -> ReadResult:
        """Complete batches after `position` (see the interface)."""
        return self._read(session_id, position, None)[0]

    def read_some(
        self, session_id: str, position: Position | None, limit: int
    ) -> tuple[ReadResult, bool]:
        """Complete batches after `position`, stopping after the last batch that ends
        within `limit` bytes (or the first batch, if longer) unless the rest of the log
        is under 1.5 `limit`s, which comes whole; True when it stopped early."""
        return self._read(session_id, position, max(1, limit))

    def _read(
        self, session_id: str, position: Position | None, limit: int | None
    ) -> tuple[ReadResult, bool]:
        sess = self._session(session_id)
        paths = sess.paths
        where = str(paths.log)
        paths.check_no_links()
        try:
            fd = open_private(paths.log, os.O_RDONLY)
        except FileNotFoundError:
            return ReadResult(b"", EMPTY_HEAD, position is not None, where), False
        except OSError as exc:
            raise _storage_error(paths.log, "opening the log", exc) from exc
        cut = False  # whether this read stopped before the end of the file
        try:
            st = os.fstat(fd)
            ident = (st.st_dev, st.st_ino)
            size = st.st_size
            reset = False
            pos = position if isinstance(position, FilePosition) else None
            if pos is None or pos.ident != ident or not _still_there(fd, pos):
                # a new file (a snapshot installed, a repair), or an inode number reused
                reset = position is not None
                pos = None
            start = 0 if pos is None else pos.offset
            # from the start: an opening snapshot's header says where its line ends and
            # what its envelope holds, so a long one is read once and never decoded whole
            first = snapshot_header(fd) if pos is None and size else None
            if size < start:
                raise CorruptLogError(
                    where,
                    size,
                    pos.seq if pos else None,
                    f"log shrank below a read position {start}",
                )
            want = size - start
            if limit is not None and want > limit + (limit >> 1):
                want = limit  # else the rest in one piece: no short last piece, no copy
                if first is not None and want <= first[0].length:
                    want = first[0].length + 1
                    if size - want <= limit >> 1:
                        want = size
            while True:
                buf = pread_all(fd, want, start)
                end, last = _committed_end(buf, where, start, first)
                if last is not None or want >= size - start:
                    break
                want = min(size - start, want * 4)  # a batch longer than the chunk
            cut = want < size - start and last is not None
            if pos is not None:
                base_seq = pos.base_seq
            else:
                base_seq = first[0].seq if first is not None else _base_seq(fd, size)
        except OSError as exc:
            raise _storage_error(paths.log, "reading the log", exc) from exc
        finally:
            os.close(fd)
        if start + len(buf) == size and buf[-1:] not in (b"", b"\n"):
            _refuse_damaged_last_line(buf, start, where, pos)
        if last is None:
            if pos is not None:
                head = FilePosition(
                    ident, pos.offset, pos.seq, pos.link, pos.h, pos.base_seq, size
                ).head()
            else:
                head = FilePosition(ident, 0, 0, "", "", 0, size).head() if size else EMPTY_HEAD
            return ReadResult(b"", head, reset, where, start), False
        head = _head_at(ident, start + end, last, base_seq, size)
        data: bytes | memoryview = buf
        if end < len(buf):  # a piece's partial last batch is cut off without a copy
            data = memoryview(buf)[:end] if limit is not None else buf[:end]
        return ReadResult(data, head, reset, where, start), cut

    def head(self, session_id: str) -> Head:
        """The last committed line, from the tail of the file alone."""
        sess = self._session(session_id)
        paths = sess.paths
        paths.check_no_links()
        try:
            fd = open_private(paths.log, os.O_RDONLY)
        except FileNotFoundError:
            return EMPTY_HEAD
        except OSError as exc:
            raise _storage_error(paths.log, "opening the log", exc) from exc
        try:
            return self._current_head(sess, fd, recover=False)
        except OSError as exc:
            raise _storage_error(paths.log, "reading the log", exc) from exc
        finally:
            os.close(fd)

    @contextmanager
    def live_view(self, session_id: str) -> Iterator[LiveView | None]:
        """The live log through one open descriptor: its head, and preads of it (the
        descriptor keeps this file even if a compaction renames another over it)."""
        sess = self._session(session_id)
        paths = sess.paths
        where = str(paths.log)
        paths.check_no_links()
        try:
            fd = open_private(paths.log, os.O_RDONLY)
        except FileNotFoundError:
            yield LiveView(EMPTY_HEAD, lambda a, b: b"", where)
            return
        except OSError as exc:
            raise _storage_error(paths.log, "opening the log", exc) from exc

        def read_span(start: int, end: int) -> bytes:
            try:
                return pread_all(fd, end - start, start)
            except OSError as exc:
                raise _storage_error(paths.log, "reading the log", exc) from exc

        try:
            try:
                head = self._current_head(sess, fd, recover=False)
            except OSError as exc:
                raise _storage_error(paths.log, "reading the log", exc) from exc
            yield LiveView(head, read_span, where)
        finally:
            os.close(fd)

    def _current_head(self, sess: _Session, fd: int, *, recover: bool) -> Head:
        """The head of the open log `fd`; with `recover` (writers' lock held) a torn tail
        is set aside and cut off."""
        st = os.fstat(fd)
        ident = (st.st_dev, st.st_ino)
        size = st.st_size
        known = sess.known
        if known is not None:
            pos = known.position
            assert isinstance(pos, FilePosition)
            if pos.ident == ident and pos.offset == size and _still_there(fd, pos):
                return known  # nobody wrote since this process did
        where = str(sess.paths.log)
        last, cut = find_head(fd, size, where)
        if cut < size:
            start = max(0, cut - _TAIL_CHUNK)
            _refuse_damaged_last_line(pread_all(fd, size - start, start), start, where, None)
        if cut < size and recover:
            self._set_aside_torn(sess, fd, cut, size)
        if last is None:  # nothing committed (an empty file, blank lines, a torn first batch)
            return FilePosition(ident, cut, 0, "", "", 0, size).head() if size else EMPTY_HEAD
        return _head_at(ident, cut, last, _base_seq(fd, cut), size)

    def _set_aside_torn(self, sess: _Session, fd: int, cut: int, size: int) -> None:
        """Save the bytes after the last complete batch beside the log, then cut them."""
        path = sess.paths.log
        aside = _save_aside(path, "torn", pread_all(fd, size - cut, cut))
        log.warning(
            "eventstore: %s: set aside a torn tail of %d bytes at byte %d (saved to %s)",
            path,
            size - cut,
            cut,
            aside.name,
        )
        os.ftruncate(fd, cut)
        if self.durability == "fsync":
            os.fsync(fd)

    def history(self, session_id: str) -> History:
        """The archive files in sequence order, then the live log, as of one instant.

        Taken without the lock, so a busy writer cannot starve a reader: the archive is
        listed, every file opened, the live log opened, and the archive listed again; if
        an install changed anything meanwhile, the picture is taken again (under the
        writers' lock after many tries). The files are then read through those
        descriptors, so later installs change nothing of the picture.
        """
        sess = self._session(session_id)
        paths = sess.paths
        paths.check_no_links()
        if not os.path.lexists(paths.dir):
            return _FileHistory([], [])
        for _ in range(_HISTORY_TRIES):
            picture = _picture(paths)
            if picture is not None:
                return picture
        with self._locked(sess, create=False) as exists:  # installs without end: wait one out
            picture = _picture(paths) if exists else _FileHistory([], [])
            assert picture is not None  # nothing changes while the lock is held
            return picture

    def prune_history(self, session_id: str, before_seq: int) -> list[PrunedSegment]:
        """Unlink, under the writers' lock, the archive files whose last line comes
        before `before_seq` (pending links, which a compaction still names, are left),
        then fsync the archive directory."""
        sess = self._session(session_id)
        paths = sess.paths
        removed: list[PrunedSegment] = []
        with self._locked(sess, create=False) as exists:
            if not exists:
                return []
            found = []
            for name in _archive_names(paths.archive):
                m = ARCHIVE_NAME.match(name)
                assert m is not None
                if not m[3] and int(m[2]) < before_seq:
                    found.append((int(m[1]), int(m[2]), name))
            for first, last, name in sorted(found):
                path = paths.archive / name
                try:
                    size = os.lstat(path).st_size
                    os.unlink(path)
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    raise _storage_error(path, "removing an archived log", exc) from exc
                removed.append(PrunedSegment(str(path), first, last, size))
            if removed:
                try:
                    fsync_dir(paths.archive)
                except OSError as exc:
                    raise _storage_error(paths.archive, "syncing the archive", exc) from exc
        return removed

    def wait(self, session_id: str, position: Position | None, timeout: float) -> bool:
        """Poll the file's identity and size until they differ from `position`'s."""
        paths = self._session(session_id).paths
        pos = position if isinstance(position, FilePosition) else None
        seen = (pos.ident, pos.seen) if pos is not None else None
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            try:
                st = os.lstat(paths.log)
                now: tuple[tuple[int, int], int] | None = ((st.st_dev, st.st_ino), st.st_size)
            except (FileNotFoundError, NotADirectoryError):
                now = None
            if now != seen and not (seen is None and now is not None and now[1] == 0):
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(0.05, left))

    # -- writing ----------------------------------------------------------------------

    def append(self, session_id: str, batch: EncodedBatch, expected: Head) -> Head:
        """Write `batch` under the writers' lock if the head is still `expected`.

        The hot path (no generator context manager, no path lookups): the cached
        descriptors, and the head this process left when the log's size is still the
        size it left (the generation check in `_acquire` proved it is the same file).
        """
        sess = self._sessions.get(session_id) or self._session(session_id)
        with sess.lock:
            self._acquire(sess, True)
            try:
                return self._append_locked(sess, batch, expected)
            except BaseException:
                sess.known = None
                raise
            finally:
                _unlock(sess.lock_fd)

    def _append_locked(self, sess: _Session, batch: EncodedBatch, expected: Head) -> Head:
        paths = sess.paths
        fd = sess.log_fd
        if fd < 0:
            try:
                fd = sess.log_fd = open_private(paths.log, os.O_RDWR | os.O_APPEND)
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise _storage_error(paths.log, "opening the log", exc) from exc
        head = EMPTY_HEAD
        if fd >= 0:
            try:
                known = sess.known
                if self.durability == "fsync" and sess.log_link is not None:
                    # no stat of the log: asking a file's times makes its next write log
                    # its inode (fine-grained timestamps, Linux 6.13+), which every flush
                    # of the journal then commits too (~50 us an append here). The kernel
                    # names the descriptor's file, "(deleted)" once renamed over
                    fast = (
                        known is not None
                        and _fd_path(fd) == sess.log_link
                        and os.lseek(fd, 0, os.SEEK_END) == known.size
                    )
                    st = None
                else:
                    # by path, not by descriptor: a replacer that does not bump the
                    # generation (a 0.1.0 process compacting) must not leave us writing
                    # to the old file
                    st = os.lstat(paths.log_str)
                    fast = (
                        known is not None
                        and st.st_size == known.size
                        and (st.st_dev, st.st_ino) == known.position.ident  # type: ignore[union-attr]
                    )
                if fast:
                    head = known  # type: ignore[assignment]  # nobody wrote since this process did
                else:
                    if st is None:
                        st = os.lstat(paths.log_str)
                    fst = os.fstat(fd)
                    if (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino):
                        sess.drop_log_fd()  # the path names another file now: open that
                        fd = sess.log_fd = open_private(paths.log, os.O_RDWR | os.O_APPEND)
                    head = self._current_head(sess, fd, recover=True)
            except FileNotFoundError:
                sess.drop_log_fd()  # removed behind our back: as if never created
                fd = -1
            except OSError as exc:
                raise _storage_error(paths.log, "recovering the tail", exc) from exc
        if head.seq != expected.seq or head.link != expected.link:  # not same_chain_point
            sess.known = head if head.position is not None else None
            raise HeadMovedError(str(paths.log), expected, head)
        created = fd < 0
        if created:
            fd, head = self._create(sess)
            sess.log_fd = fd
        pos = head.position
        start = head.size
        ident = pos.ident if pos is not None else _ident(fd)  # type: ignore[attr-defined]
        try:
            self._write(sess, fd, batch, start, ident)
        except BaseException:
            if created:  # a call that writes nothing leaves no session behind
                self._discard_new_session(sess)
            raise
        size = start + len(batch.data)
        base = head.base_seq or batch.first_seq
        h = batch.hashes[-1]
        sess.known = new = Head(
            batch.last_seq,
            batch.link,
            h,
            FilePosition(ident, size, batch.last_seq, batch.link, h, base, size),
            size,
            base,
        )
        if sess.log_link is None and self.durability == "fsync":
            # the descriptor is the live log (checked by path above, or just created):
            # from the next append on, the fast path asks the kernel, not the log's stat
            sess.log_link = _fd_path(fd)
        return new

    def _create(self, sess: _Session) -> tuple[int, Head]:
        """Create the log file (the first append of a session)."""
        paths = sess.paths
        try:
            fd = open_private(paths.log, os.O_RDWR | os.O_CREAT | os.O_APPEND)
        except OSError as exc:
            raise _storage_error(paths.log, "creating the log", exc) from exc
        try:
            if self.durability == "fsync":  # the new name must survive power loss too
                fsync_dir(paths.dir)
                fsync_dir(paths.dir.parent)
                fsync_dir(paths.dir.parent.parent)  # the store root holds `sessions`
        except OSError as exc:
            os.close(fd)
            self._discard_new_session(sess)
            raise _storage_error(paths.log, "creating the log", exc) from exc
        return fd, EMPTY_HEAD

    def _discard_new_session(self, sess: _Session) -> None:
        """Undo the first append of a session that failed (writers' lock held): remove the
        empty log this call created and, when nothing else is kept for the session, its
        directory (renamed away first, as `remove_session` does, so a writer waiting on
        the lock notices and starts over). Best effort: the error being raised is the one
        the caller needs."""
        paths = sess.paths
        sess.known = None
        sess.drop_log_fd()  # the cached descriptor may name the file removed here
        try:
            if os.path.lexists(paths.log):
                if os.lstat(paths.log).st_size:
                    return  # bytes a failed cut-back left: the next writer sets them aside
                # other processes' cached descriptors: reopen (the journal goes below)
                self._bump_generation(sess, retire=False)
                os.unlink(paths.log)
            if os.path.lexists(paths.archive):
                return
            trash = paths.dir.parent / f"{_REMOVED_PREFIX}{uuid.uuid4().hex}"
            os.rename(paths.dir, trash)
            sess.gen = b"removed"  # this process's lock descriptor too: reopen at the path
            import shutil  # here: it imports bz2 and lzma, ~2 ms of every `import`

            shutil.rmtree(trash, ignore_errors=True)
        except OSError:
            pass

    def _write(
        self, sess: _Session, fd: int, batch: EncodedBatch, start: int, ident: tuple[int, int]
    ) -> None:
        """Write a batch at the end (`start`) of the log `ident` open at `fd`, durably
        under `durability="fsync"`; on failure cut it back off and raise StorageError."""
        data, path = batch.data, sess.paths.log
        try:
            n = os.write(fd, data)  # one call, no memoryview: the usual case
            if n != len(data):
                write_all(fd, data[n:])  # a short write: the rest (or the error)
        except OSError as exc:
            try:
                os.ftruncate(fd, start)
            except OSError:
                pass  # the next writer sets the torn tail aside
            raise StorageError(
                f"{path}: append at byte {start} failed: {exc.strerror}", exc.errno
            ) from exc
        if self.durability == "fsync":
            try:
                self._make_durable(sess, fd, batch, start, ident)
            except OSError as exc:
                # not acknowledged, so not left visible: a retry must not store it twice
                try:
                    os.ftruncate(fd, start)
                except OSError as cut:
                    raise StorageError(
                        f"{path}: fsync after byte {start} failed ({exc.strerror}) and cutting"
                        f" the append back off failed too ({cut.strerror}): the batch is in"
                        " the log but may not be durable; retry with an idempotency key",
                        exc.errno,
                    ) from exc
                if getattr(exc, "mirror_kept", False):
                    raise StorageError(
                        f"{path}: fsync after byte {start} failed ({exc.strerror}), and so did"
                        " voiding the batch in the journal: it was cut back off the log but"
                        " may return after a crash; retry with an idempotency key",
                        exc.errno,
                    ) from exc
                raise StorageError(
                    f"{path}: fsync after byte {start} failed: {exc.strerror}; the append was"
                    " cut back off, nothing was stored",
                    exc.errno,
                ) from exc

    def _make_durable(
        self, sess: _Session, fd: int, batch: EncodedBatch, start: int, ident: tuple[int, int]
    ) -> None:
        """Flush an append `_write` wrote at `start` (writers' lock held): into the
        journal's mirror when the epoch the lock file's hints name mirrors this log up
        to `start` and has room, else by flushing the log itself, which then starts a
        new epoch at its end (`eventstore.engines.file.journal`). An OSError means
        nothing was made durable: the caller cuts the append back off."""
        data = batch.data
        number, mirrored = file_journal.hints(sess.head)
        ep = sess.epoch
        if ep is None or ep.number != number:
            ep = sess.epoch = self._epoch_named(sess, number, ident)
        voided = True  # nothing of the batch is in the mirror, or zeros are over it
        if ep is not None and mirrored == start and file_journal.fits(ep, start, len(data)):
            try:
                file_journal.mirror(sess.journal_fd, ep, data, start)
            except OSError:
                # flush the log instead; the bytes may be in the mirror, and if that
                # flush fails too they must not come back after a crash: zeros over
                # them, flushed (if that fails too, the caller says the batch may return)
                sess.epoch = None
                try:
                    file_journal.mirror(sess.journal_fd, ep, bytes(len(data)), start)
                except OSError:
                    voided = False
            else:
                self._set_hints(sess, ep.number, start + len(data))
                return
        try:
            datasync(fd)
        except OSError as exc:
            exc.mirror_kept = not voided  # type: ignore[attr-defined]  # (for _write)
            raise
        self._start_epoch_after(sess, start + len(data), batch, ident)

    def _start_epoch_after(
        self, sess: _Session, end: int, batch: EncodedBatch, ident: tuple[int, int]
    ) -> None:
        """Start an epoch at the end of a batch the log itself made durable; a failure
        costs the next append the same again, never this one its durability."""
        try:
            self._start_epoch(sess, end, batch.last_seq, batch.link, ident)
        except (OSError, EventStoreError) as exc:  # (a planted link): the append is durable
            # in the log; the next one tries again
            sess.epoch = None
            log.debug(
                "eventstore: %s: starting a journal epoch failed: %s", sess.paths.journal, exc
            )

    def _epoch_named(
        self, sess: _Session, number: int, ident: tuple[int, int]
    ) -> file_journal.Epoch | None:
        """The journal's epoch, if it is the one numbered `number` and mirrors the log
        `ident` (another process of this store may have started it)."""
        if number == 0:
            return None
        try:
            if sess.journal_fd < 0:
                sess.journal_fd = file_journal.open_journal(sess.paths.journal)
            if not file_journal.whole(sess.journal_fd):
                return None  # cut short (a mirror write would leave a hole before it)
            ep = file_journal.read_epoch(sess.journal_fd)
        except (OSError, EventStoreError):
            return None
        return ep if ep is not None and ep.number == number and ep.ident == ident else None

    def _start_epoch(
        self, sess: _Session, start: int, seq: int, link: str, ident: tuple[int, int]
    ) -> None:
        """Start a new epoch of the journal at log offset `start` (durable in the log up
        to there), creating the journal on the session's first durable append."""
        if sess.journal_fd < 0:
            sess.journal_fd = file_journal.create(sess.paths.journal)
        number = int.from_bytes(os.urandom(8), "big") | 1  # (never 0: "no epoch")
        ep = file_journal.Epoch(number, start, ident, seq, link)
        file_journal.start_epoch(sess.journal_fd, ep)
        sess.epoch = ep
        self._set_hints(sess, number, start)

    def _set_hints(self, sess: _Session, number: int, end: int) -> None:
        """Write the lock file's hints (never flushed: a lost hint costs a new epoch)."""
        gen = sess.gen if len(sess.gen) == _GEN_BYTES else bytes(_GEN_BYTES)
        try:
            self._write_lock_head(sess, gen, (number, end))
        except OSError:
            sess.epoch = None

    def install_snapshot(
        self, session_id: str, line: bytes, covers: Head, *, keep_history: bool
    ) -> InstallResult:
        """Swap in a new log (the snapshot + lines after `covers`); see the module docstring."""
        sess = self._session(session_id)
        paths = sess.paths
        where = str(paths.log)
        with self._locked(sess):
            try:
                _remove_strays(paths, _live_ident(paths.log))
            except OSError as exc:
                raise StorageError(f"{paths.dir}: cleaning up after a crash failed: {exc}") from exc
            try:
                fd = open_private(paths.log, os.O_RDWR | os.O_APPEND)
            except FileNotFoundError:
                raise HeadMovedError(where, covers, EMPTY_HEAD) from None
            except OSError as exc:
                raise _storage_error(paths.log, "opening the log", exc) from exc
            sess.known = None
            try:
                head = self._current_head(sess, fd, recover=True)
                pos = covers.position
                if (
                    not isinstance(pos, FilePosition)
                    or pos.ident != _ident(fd)
                    or head.seq < covers.seq
                    or not _still_there(fd, pos)
                ):
                    raise HeadMovedError(where, covers, head)
                tail = pread_all(fd, head.size - pos.offset, pos.offset)
                # lines appended after `covers` stay live (copied after the snapshot):
                # the archive then keeps only what the snapshot replaced, so history
                # holds each line once
                prefix = pread_all(fd, pos.offset, 0) if tail and keep_history else b""
                old_base = head.base_seq
                # the events after the old log's opening snapshot, when the archive
                # already holds what that snapshot replaced: only they are archived, so
                # an archive holds each event once (never a copy of a snapshot's state)
                _remove_leftover_copies(paths.archive, fd)
                since = _events_after_archived_snapshot(fd, pos.offset, paths.archive)
                if since is not None and keep_history:
                    prefix = b""
            except OSError as exc:
                raise _storage_error(paths.log, "reading the log", exc) from exc
            finally:
                os.close(fd)
            data = line + tail
            archived: Path | None = None
            pending: Path | None = None

            def link_old_log() -> None:
                nonlocal archived, pending
                # the old log becomes history: its last appends may still be only in the
                # OS cache (durability="flush"), or durable only in the journal's mirror
                # (which mirrors the live log only), and the archive must hold them all
                sync_fd = open_private(paths.log, os.O_RDONLY)
                try:
                    os.fsync(sync_fd)
                finally:
                    os.close(sync_fd)
                ensure_private_dir(paths.archive)
                # the archive's own name must be durable before the swap relies on it:
                # otherwise a power loss can keep the new log and lose `archive/`
                fsync_dir(paths.dir)
                archived = _archive_name(paths.archive, old_base, head.seq)
                # linked under a pending name: until the swap it is the live log, and
                # history readers must not take it for history
                pending = archived.with_name(archived.name + _PENDING)
                os.link(paths.log, pending)
                fsync_dir(paths.archive)

            if since is not None and keep_history:
                try:
                    archived = _archive_events(paths.archive, old_base + 1, covers.seq, since)
                except OSError as exc:
                    raise StorageError(
                        f"{paths.log}: archiving failed, the log is unchanged: {exc}", exc.errno
                    ) from exc
                keep_history = False  # archived already: nothing to link
            try:
                self._bump_generation(sess)  # before the swap: see _bump_generation
                write_atomically(
                    paths.log, data, before_replace=link_old_log if keep_history else None
                )
            except BaseException as exc:
                if pending is not None:
                    try:
                        os.unlink(pending)
                    except OSError:
                        pass
                if isinstance(exc, OSError) and not isinstance(exc, EventStoreError):
                    raise StorageError(
                        f"{paths.log}: installing a snapshot failed, the log is unchanged: {exc}",
                        exc.errno,
                    ) from exc
                raise
            try:  # the new log is in place; this only gives the archive link its name
                if pending is not None and archived is not None:
                    if tail:
                        # a crash before this leaves the whole old log under its own
                        # (first..last) name: overlapping copies, which history reads once
                        archived = _archive_name(paths.archive, old_base, covers.seq)
                        write_atomically(archived, prefix)
                        os.unlink(pending)
                        fsync_dir(paths.archive)
                    else:
                        os.rename(pending, archived)
                        fsync_dir(paths.archive)
            except OSError as exc:
                raise StorageError(
                    f"{paths.log}: compacted, but naming the archive failed ({exc}); the next"
                    " compaction finishes it",
                    exc.errno,
                ) from exc
            ident = _live_ident(paths.log)
            h = head.h if tail else line.rstrip(b"\n")[-18:-2].decode("ascii")
            new = FilePosition(
                ident, len(data), head.seq, head.link, h, covers.seq, len(data)
            ).head()
            sess.known = new
        return InstallResult(new, str(archived) if archived else None, head.size, len(data))

    @contextmanager
    def hold(self, session_id: str) -> Iterator[RepairHold]:
        """The writers' lock, for a repair of the live log."""
        sess = self._session(session_id)
        with self._locked(sess, create=False) as exists:
            sess.known = None
            try:
                yield _FileRepairHold(sess.paths, exists, lambda: self._bump_generation(sess))
            finally:
                sess.known = None

    # -- sessions ---------------------------------------------------------------------

    def list_sessions(self) -> list[str]:
        """Every session with a log file, by original id."""
        return list_session_ids(self.root)

    def remove_session(self, session_id: str) -> bool:
        """Rename the session directory away under its lock (one atomic step: readers see
        the whole session or none of it), then delete what was renamed."""
        sess = self._session(session_id)
        paths = sess.paths
        trash = paths.dir.parent / f"{_REMOVED_PREFIX}{uuid.uuid4().hex}"
        with self._locked(sess, create=False) as exists:
            if not exists:
                return False
            had = os.path.lexists(paths.log) or os.path.lexists(paths.archive)
            try:
                # other processes' cached descriptors: reopen (the journal goes with it)
                self._bump_generation(sess, retire=False)
                os.rename(paths.dir, trash)
                fsync_dir(paths.dir.parent)
            except OSError as exc:
                raise _storage_error(paths.dir, "removing the session", exc) from exc
            # this process's too: a generation no lock file holds (8 bytes or none)
            sess.gen = b"removed"
        # what was renamed is no session any more: delete it, and what a removal that
        # crashed before finishing left behind
        for name in os.listdir(trash.parent):
            if name.startswith(_REMOVED_PREFIX):
                import shutil  # here: it imports bz2 and lzma, ~2 ms of every `import`

                shutil.rmtree(trash.parent / name, ignore_errors=True)
        return had

    # -- the fold cache -----------------------------------------------------------------

    def open_cache(self, session_id: str, name: str) -> tuple[Head, CacheReader] | None:
        """`<session dir>/fold-<name>.cache`, if its position is still in the live log:
        the same file (device, inode), at least that long, and the `h` before it."""
        sess = self._session(session_id)
        paths = sess.paths
        path = paths.dir / _cache_file_name(name)
        paths.check_no_links()
        try:
            # O_NONBLOCK: a FIFO planted there must not hang the load
            fd = open_private(path, os.O_RDONLY | os.O_NONBLOCK)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except (OSError, UnsafePathError) as exc:
            log.warning("eventstore: %s: fold cache ignored: %s", path, exc)
            return None
        try:
            found = self._cache_position(fd, paths)
        except OSError:
            found = None
        except BaseException:
            os.close(fd)
            raise
        if found is None:
            os.close(fd)
            return None
        pos, start, size = found
        return pos.head(), _FileCacheReader(fd, start, size)

    @staticmethod
    def _cache_position(fd: int, paths: SessionPaths) -> tuple[FilePosition, int, int] | None:
        """Where in the live log the cache open at `fd` was folded to, and where its
        face bytes start and how many there are; None for a file that is no cache of the
        live log (checked before the rest is read: a file planted there may be huge)."""
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > _MAX_CACHE_BYTES:
            return None
        first = pread_all(fd, min(st.st_size, _CACHE_HEAD_MAX), 0)
        nl = first.find(b"\n")
        if nl < 0:
            return None
        try:
            c = _cache_head_decoder.decode(first[:nl])
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None
        pos = FilePosition((c.dev, c.ino), c.offset, c.seq, c.link, c.h, c.base_seq, c.offset)
        if not _in_live_log(paths.log, pos):
            return None
        return pos, nl + 1, st.st_size - nl - 1

    def store_cache(self, session_id: str, name: str, head: Head, data: list[bytes]) -> None:
        """Write the cache file atomically (0600), with where in the log `head` is."""
        pos = head.position
        if not isinstance(pos, FilePosition):
            return
        paths = self._session(session_id).paths
        paths.check_no_links()
        if not os.path.lexists(paths.log):
            return  # a call that writes nothing creates nothing
        c = _CacheHead(
            pos.ident[0], pos.ident[1], pos.offset, pos.seq, pos.link, pos.h, pos.base_seq
        )
        try:
            write_atomically(
                paths.dir / _cache_file_name(name),
                [msgspec.json.encode(c) + b"\n", *data],
                durable=False,  # a cache checks itself: a power loss costs a rebuild
            )
        except (FileNotFoundError, NotADirectoryError):
            pass  # the session was removed meanwhile

    def close(self) -> None:
        """Close the cached descriptors (waiting for a writer using them) and forget
        per-session state. The engine stays usable: descriptors reopen on use.

        A session this process appended to durably has its journal's epoch retired (the
        log flushed, the header cleared): the next process to open it then finds no
        epoch to compare the log with, and its first look costs nothing. Best effort: a
        failure leaves the epoch, which the next process checks as after a crash."""
        with self._guard:
            sessions, self._sessions, self._open = list(self._sessions.values()), {}, {}
        for sess in sessions:
            with sess.lock:
                if sess.epoch is not None and sess.lock_fd >= 0:
                    try:
                        if self._acquire(sess, False):
                            try:
                                self._retire_journal(sess)
                            finally:
                                _unlock(sess.lock_fd)
                    except (OSError, EventStoreError) as exc:
                        log.debug("eventstore: %s: retiring the epoch failed: %s",
                                  sess.paths.journal, exc)  # fmt: skip
                sess.drop_fds()


def _picture(paths: SessionPaths) -> _FileHistory | None:
    """The history of a session as of now, or None if an install changed the archive or
    replaced the log while it was being taken."""
    fds: list[int] = []
    picture: _FileHistory | None = None
    try:
        names = sorted(_archive_names(paths.archive))
        opened: list[tuple[str, int, os.stat_result]] = []
        for name in names:
            fd, st = _open_existing(paths.archive / name)
            if fd is None or st is None:
                return None  # a pending link renamed, or a re-compaction: look again
            fds.append(fd)
            opened.append((name, fd, st))
        live_fd, live_st = _open_existing(paths.log)
        if live_fd is not None:
            fds.append(live_fd)
        if sorted(_archive_names(paths.archive)) != names:
            return None  # an install archived a log meanwhile
        live = (live_st.st_dev, live_st.st_ino) if live_st is not None else (0, 0)
        keyed: list[tuple[tuple[int, int, int, str], Segment]] = []
        for name, fd, st in opened:
            m = ARCHIVE_NAME.match(name)
            assert m is not None
            if m[3] and (st.st_dev, st.st_ino) == live:
                continue  # a pending link that is still the live log: not history yet
            # a pending link to another file is the old log of an install that stopped
            # (or is) just after its swap: history, which the next install names
            seg = _FileSegment(
                fd, str(paths.archive / name), st.st_size, True, int(m[1]), int(m[2])
            )
            # the same range twice: the older file (last written earlier) comes first
            keyed.append(((int(m[1]), int(m[2]), st.st_mtime_ns, name), seg))
        segments = [seg for _, seg in sorted(keyed, key=lambda k: k[0])]
        if live_fd is not None and live_st is not None:
            segments.append(_FileSegment(live_fd, str(paths.log), live_st.st_size, False))
        picture = _FileHistory(segments, fds)  # it closes every descriptor opened here
        return picture
    finally:
        if picture is None:
            for fd in fds:
                os.close(fd)


class _FileSegment(Segment):
    __slots__ = ("_fd",)

    def __init__(
        self,
        fd: int,
        where: str,
        size: int,
        archived: bool,
        first_seq: int | None = None,
        last_seq: int | None = None,
    ) -> None:
        self._fd = fd
        self.where = where
        self.size = size
        self.archived = archived
        self.first_seq = first_seq
        self.last_seq = last_seq

    def read(self) -> bytes:
        try:
            return pread_all(self._fd, self.size, 0)
        except OSError as exc:
            raise _storage_error(self.where, "reading", exc) from exc


class _FileHistory(History):
    def __init__(self, segments: list[Segment], fds: list[int]) -> None:
        super().__init__(segments)
        self._fds = fds

    def close(self) -> None:
        fds, self._fds = self._fds, []
        for fd in fds:
            os.close(fd)

    def __del__(self) -> None:
        self.close()


class _FileRepairHold(RepairHold):
    def __init__(
        self, paths: SessionPaths, exists: bool, before_replace: Callable[[], None]
    ) -> None:
        self.paths = paths
        self._before_replace = before_replace  # bumps the generation
        self.where = str(paths.log)
        self._data: bytes | None = None if exists else b""

    @property
    def data(self) -> bytes:
        if self._data is None:
            fd, _ = _open_existing(self.paths.log)
            if fd is None:
                self._data = b""
            else:
                try:
                    self._data = pread_all(fd, os.fstat(fd).st_size, 0)
                finally:
                    os.close(fd)
        return self._data

    def keep_prefix(self, n: int, reason: str) -> str | None:
        data = self.data
        if n >= len(data):
            return None
        log_path = self.paths.log
        aside = log_path.with_name(f"{log_path.name}.{reason}-{_stamp()}")
        try:
            os.link(log_path, aside)  # the original bytes, kept before anything changes
            fsync_dir(log_path.parent)
            self._before_replace()
            write_atomically(log_path, data[:n])
        except OSError as exc:
            raise _storage_error(log_path, "repairing the log", exc) from exc
        self._data = data[:n]
        return str(aside)

    def rewrite(self, data: bytes, reason: str) -> str:
        log_path = self.paths.log
        aside = log_path.with_name(f"{log_path.name}.{reason}-{_stamp()}")
        try:
            os.link(log_path, aside)  # the original bytes, kept before anything changes
            fsync_dir(log_path.parent)
            self._before_replace()
            write_atomically(log_path, data)
        except OSError as exc:
            raise _storage_error(log_path, "repairing the log", exc) from exc
        self._data = data
        return str(aside)


# -- helpers ---------------------------------------------------------------------------


class _FileCacheReader(CacheReader):
    """The part of a cache file after the engine's line, read front to back by `pread`
    (a descriptor of its own: a load reads a long cache a frame at a time)."""

    def __init__(self, fd: int, start: int, size: int) -> None:
        self._fd = fd
        self._at = start
        self.size = size
        self._end = start + size

    def read(self, n: int) -> bytes:
        """The next `n` bytes (fewer only at the end, or if the file was cut meanwhile)."""
        n = max(0, min(n, self._end - self._at))
        try:
            data = pread_all(self._fd, n, self._at)
        except OSError:
            data = b""  # read as the end: whoever reads checks what it got
        self._at += len(data)
        return data

    def close(self) -> None:
        """Close the descriptor."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def __del__(self) -> None:
        self.close()


class _CacheHead(msgspec.Struct):
    """Where in the log a fold cache's head is (the file engine's part of the file)."""

    dev: int
    ino: int
    offset: int
    seq: int
    link: str
    h: str
    base_seq: int


_cache_head_decoder = msgspec.json.Decoder(_CacheHead)
_MAX_CACHE_BYTES = 1 << 30  # a cache larger than this is not one we wrote: ignored
_CACHE_HEAD_MAX = 4096  # the engine's line of a cache is shorter (ints, two 16-hex)
_CACHE_PREFIX = "fold-"
_PLAIN_NAME = re.compile(r"[a-z0-9_]{1,64}\Z")


def _cache_file_name(name: str) -> str:
    """The cache file of a projection: its name when plain, else a digest of it."""
    if not _PLAIN_NAME.match(name):
        name = "x" + hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"{_CACHE_PREFIX}{name}.cache"


def from_url(url_or_path: str | os.PathLike[str], **options: Any) -> FileEngine:
    """The file engine of a path or a `file://` URL (`file:///abs/dir`)."""
    text = os.fspath(url_or_path)
    if text.startswith("file://"):
        rest = text[len("file://") :]
        if rest and not rest.startswith("/"):
            host, _, path = rest.partition("/")
            if host not in ("", "localhost"):
                raise ValueError(f"{text}: a file:// URL names a local path (file:///abs/dir)")
            rest = "/" + path
        text = rest
    if not text:
        raise UnsafePathError("an empty store path would mean the current directory; give one")
    return FileEngine(text, **options)


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
        for path in reversed(missing):  # their names must survive power loss too
            try:
                fsync_dir(path.parent)
            except OSError:
                pass  # the directories exist and work; only power-loss durability is lost
        return
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePathError(f"store root {root} exists and is not a directory")


def _save_aside(log_path: Path, kind: str, data: bytes) -> Path:
    """Keep `data` beside the log as `<log>.<kind>-<UTC time>` (bytes recovery is about
    to cut or overwrite: never lost)."""
    aside = log_path.with_name(f"{log_path.name}.{kind}-{_stamp()}")
    write_atomically(aside, data)
    return aside


def _stamp() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")


def _lacking(paths: SessionPaths, log_flags: int) -> tuple[int, int, bytes] | None:
    """What the log lacks of what the journal acknowledged (`file_journal.lacking`): the
    log open with `log_flags` (for the caller to close), the offset and the bytes."""
    try:
        jfd = file_journal.open_journal(paths.journal, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except NotAJournalError as exc:
        log.warning("eventstore: %s is not a journal, ignored: %s", paths.journal, exc)
        return None
    try:
        lfd = open_private(paths.log, log_flags)
    except FileNotFoundError:
        os.close(jfd)
        return None
    try:
        found = file_journal.lacking(jfd, lfd)
    except BaseException:
        os.close(lfd)
        raise
    finally:
        os.close(jfd)
    if found is None:
        os.close(lfd)
        return None
    return lfd, found[0], found[1]


def _fd_path(fd: int) -> str | None:
    """Where the kernel says the file open at `fd` is (" (deleted)" appended once it was
    unlinked or renamed over); None where there is no /proc (the caller then stats)."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None


def _ident(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return (st.st_dev, st.st_ino)


def _live_ident(path: Path) -> tuple[int, int]:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return (0, 0)
    return (st.st_dev, st.st_ino)


def _same_file(fd: int, path: Path) -> bool:
    """Whether the open file `fd` is still the file at `path`."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    return (st.st_dev, st.st_ino) == _ident(fd)


def _open_existing(path: Path) -> tuple[int | None, os.stat_result | None]:
    """Open a file for reading (never through a link); (None, None) if it is gone."""
    try:
        fd = open_private(path, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return None, None
    except OSError as exc:
        raise _storage_error(path, "opening", exc) from exc
    return fd, os.fstat(fd)


def _archive_names(archive_dir: Path) -> list[str]:
    """The names in a session's archive that are archived logs (or pending links)."""
    if os.path.islink(archive_dir):
        raise UnsafePathError(
            f"{archive_dir} is a symlink; eventstore never follows links in a store"
        )
    try:
        names = os.listdir(archive_dir)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [n for n in names if ARCHIVE_NAME.match(n)]


def _archive_name(archive_dir: Path, first: int, last: int) -> Path:
    name = archive_dir / f"{first:012d}-{last:012d}.jsonl"
    if os.path.lexists(name) or os.path.lexists(name.with_name(name.name + _PENDING)):
        name = name.with_name(f"{name.stem}-{uuid.uuid4().hex[:8]}.jsonl")  # a re-compaction
    return name


def _events_after_archived_snapshot(fd: int, end: int, archive_dir: Path) -> bytes | None:
    """The lines of the log `fd` after its opening snapshot, up to byte `end`, when the
    archive has a segment ending at that snapshot's seq (so the snapshot's events are
    held there); None when the log opens with no snapshot or its history is not kept."""
    first = snapshot_header(fd)
    if first is None:
        return None
    snap, _ = first
    if not any(
        (m := ARCHIVE_NAME.match(n)) and not m[3] and int(m[2]) == snap.seq
        for n in _archive_names(archive_dir)
    ):
        return None  # compacted without an archive before: the snapshot stands in for it
    start = snap.length + 1
    return pread_all(fd, end - start, start) if end > start else b""


def _remove_leftover_copies(archive_dir: Path, fd: int) -> None:
    """Remove archive copies an install that crashed before its swap left behind: they
    start after the live log's opening snapshot, so the live log still holds every line
    they hold (history is what the snapshot replaced, which starts at or before it)."""
    first = snapshot_header(fd)
    if first is None:
        return
    for name in _archive_names(archive_dir):
        m = ARCHIVE_NAME.match(name)
        assert m is not None
        if m[3] or int(m[1]) <= first[0].seq:
            continue
        path = archive_dir / name
        fd2, _ = _open_existing(path)
        if fd2 is None:
            continue
        try:
            opens_with_snapshot = os.pread(fd2, len(SNAPSHOT_OPEN), 0) == SNAPSHOT_OPEN
        finally:
            os.close(fd2)
        if not opens_with_snapshot:
            os.unlink(path)


def _archive_events(archive_dir: Path, first: int, last: int, data: bytes) -> Path | None:
    """Archive `data` (the lines `first`..`last`) as `<first>-<last>.jsonl`, written
    whole before the log is swapped (until then the live log holds the same lines too:
    history reads each seq once). None when there is nothing to archive. A copy a crashed
    install left under the same name holds the same lines: it is kept."""
    if not data:
        return None
    ensure_private_dir(archive_dir)
    name = archive_dir / f"{first:012d}-{last:012d}.jsonl"
    if not os.path.lexists(name):
        write_atomically(name, data)  # fsyncs the archive directory too
    return name


def _remove_strays(paths: SessionPaths, live: tuple[int, int]) -> None:
    """Finish or undo what an install that crashed left behind: temporary files go; a
    pending archive link that is still the live log goes (it would grow with it); one
    that is the old log (the swap happened) gets its final name."""
    tmp_prefix = paths.log.name + TMP_MARK
    for name in os.listdir(paths.dir):
        if name.startswith((tmp_prefix, _OLD_TMP_PREFIX)):
            os.unlink(paths.dir / name)
        elif name.startswith(_CACHE_PREFIX) and TMP_MARK in name:
            # a cache write that crashed, or one a reader (no lock) is making now: gone
            # by the time we get to it, it was renamed in; removed under it, that write
            # is lost, as a cache may be
            try:
                os.unlink(paths.dir / name)
            except FileNotFoundError:
                pass
    if os.path.isdir(paths.archive) and not os.path.islink(paths.archive):
        for name in os.listdir(paths.archive):
            if TMP_MARK in name:  # an archive copy that was never renamed in
                os.unlink(paths.archive / name)
    for name in _archive_names(paths.archive):
        if not name.endswith(_PENDING):
            continue
        path = paths.archive / name
        st = os.lstat(path)
        if (st.st_dev, st.st_ino) == live:
            os.unlink(path)
        else:
            os.rename(path, path.with_name(name[: -len(_PENDING)]))


def _refuse_damaged_last_line(buf: bytes, start: int, where: str, pos: FilePosition | None) -> None:
    """CorruptLogError if the partial last line of `buf` (bytes `start`.. of the log) is a
    committed line whose newline was damaged (see `events.damaged_newline`), not a torn
    one. `pos`: the read position `buf` starts at (its line is the one before), if any."""
    last_nl = buf.rfind(b"\n")
    tail = buf[last_nl + 1 :]
    if len(tail) <= HASH_SUFFIX_LEN:
        return
    if last_nl >= 0:
        prev = buf[buf.rfind(b"\n", 0, last_nl) + 1 : last_nl]
        if buf.rfind(b"\n", 0, last_nl) < 0 and start > 0 and pos is None:
            return  # the line before starts outside what was read: a writer finds it later
        try:
            env = _head_decoder.decode(prev)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return  # the careful reader reports the undecodable line itself
        link = (env.base_h or "") if env.type == "snapshot" else env.h
        seq = env.seq + 1
    elif pos is not None:
        link, seq = pos.link, pos.seq + 1
    elif start == 0:
        link, seq = "", 1
    else:
        return
    if damaged_newline(tail, link):
        raise CorruptLogError(
            where,
            start + last_nl + 1,
            seq,
            "the last line is complete and its h checks, but its newline was replaced by"
            " another byte: a committed line was damaged, not torn by a crash"
            " (`eventstore repair` keeps the log before it and saves the original)",
        )


def _committed_end(
    buf: bytes,
    where: str,
    start: int,
    first: tuple[SnapshotHead, str] | None = None,
) -> tuple[int, LineHead | None]:
    """The end of the last complete batch in `buf` and its closing line's envelope.

    Walks back from the last newline over lines whose batch is not closed (`more` > 0):
    usually one envelope decode. Blank lines hold nothing. `first`: the header of the
    snapshot that opens the log, when `buf` starts there (its envelope, not decoded).
    """
    end = buf.rfind(b"\n")
    while end >= 0:
        if first is not None and start == 0 and end == first[0].length:
            return end + 1, _snapshot_line_head(first)  # the opening snapshot, no scan
        prev = buf.rfind(b"\n", 0, end)
        line = buf[prev + 1 : end]
        if line.strip():
            try:
                head = _head_decoder.decode(line)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                raise CorruptLogError(
                    where, start + prev + 1, None, f"undecodable line: {exc}"
                ) from None
            if head.more == 0:
                return end + 1, head
        end = prev
    return 0, None


def find_head(fd: int, size: int, where: str) -> tuple[LineHead | None, int]:
    """The envelope of the last committed line and the end of the last complete batch.

    Reads only the tail of the file (and, when the last line is a compaction snapshot,
    its header at the start): bytes after the returned offset are a torn tail.
    """
    if size == 0:
        return None, 0
    first = snapshot_header(fd)
    first_end = first[0].length if first is not None else None
    want = 1
    while True:
        lines, cut, at_start = _tail_lines(fd, size, want, first_end)
        for off, line in lines:
            if line is None:  # the first line, a snapshot: its header says what we need
                assert first is not None
                head = _snapshot_line_head(first)
            elif not line.strip():
                continue  # a blank line holds no event
            else:
                try:
                    head = _head_decoder.decode(line)
                except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                    raise CorruptLogError(where, off, None, f"undecodable line: {exc}") from None
            if head.more == 0:
                return head, cut
            cut = off  # a line of a batch that has no closing line: torn
        if at_start:
            return None, cut
        want *= 4  # a torn batch longer than what we read: look further back


def snapshot_header(fd: int) -> tuple[SnapshotHead, str] | None:
    """The header and `h` of the snapshot that opens a file, if it opens with one."""
    found = find_snapshot_head(lambda n: os.pread(fd, n, 0))
    if found is None or found[0].length <= HASH_SUFFIX_LEN:
        return None  # (a length of 0: written before snapshots described themselves)
    head = found[0]
    tail = os.pread(fd, 19, head.length - 18)  # 16 hex digits, '"}', newline
    if len(tail) != 19 or tail[16:] != b'"}\n':
        return None
    return head, tail[:16].decode("ascii", "replace")


def _snapshot_line_head(first: tuple[SnapshotHead, str]) -> LineHead:
    """The envelope of an opening snapshot's line, from its header and `h`."""
    snap, h = first
    return LineHead(type="snapshot", seq=snap.seq, ts=snap.ts, h=h, base_h=snap.base_h)


def _base_seq(fd: int, size: int) -> int:
    """The seq of the log's first line: an opening snapshot's, else 1 (0 when empty)."""
    if size == 0:
        return 0
    buf = os.pread(fd, 4096, 0)
    if not buf.startswith(b'{"type":"snapshot",'):
        return 1
    first = snapshot_header(fd)
    if first is not None:
        return first[0].seq
    nl = buf.find(b"\n")
    line = buf[:nl] if nl >= 0 else pread_all(fd, size, 0).split(b"\n", 1)[0]
    try:
        return _head_decoder.decode(line).seq
    except (msgspec.DecodeError, msgspec.ValidationError):
        return 1


def _still_there(fd: int, pos: FilePosition) -> bool:
    """Whether the line before the position still ends with the `h` it recorded."""
    if pos.offset == 0:
        return True
    tail = (pos.h + '"}\n').encode()
    return os.pread(fd, len(tail), pos.offset - len(tail)) == tail


def _in_live_log(log_path: Path, pos: FilePosition) -> bool:
    """Whether `pos` is still in the log at `log_path`: the same file (device, inode), at
    least that long, and the `h` before it."""
    log_fd, _ = _open_existing(log_path)
    if log_fd is None:
        return False
    try:
        st = os.fstat(log_fd)
        return (
            (st.st_dev, st.st_ino) == pos.ident
            and 0 < pos.offset <= st.st_size
            and _still_there(log_fd, pos)
        )
    finally:
        os.close(log_fd)


def _tail_lines(
    fd: int, size: int, want: int, first_end: int | None
) -> tuple[list[tuple[int, bytes | None]], int, bool]:
    """Up to `want` complete lines before the end, newest first; where the partial last
    line (if any) starts; and whether the lines reach the start of the file.

    A line that ends at `first_end` (the end of an opening snapshot) is returned as
    (0, None) instead of being read: it can be longer than all the rest together.
    """
    chunk = _TAIL_CHUNK
    while True:
        start = max(0, size - chunk)
        buf = pread_all(fd, size - start, start)
        last_nl = buf.rfind(b"\n")
        if last_nl < 0 and start == 0:
            return [], 0, True
        if last_nl >= 0:
            lines: list[tuple[int, bytes | None]] = []
            end = last_nl
            while end >= 0 and len(lines) < want:
                if first_end is not None and start + end == first_end:
                    lines.append((0, None))
                    return lines, start + last_nl + 1, True
                prev = buf.rfind(b"\n", 0, end)
                if prev < 0 and start > 0:
                    break  # this line may begin before the chunk
                lines.append((start + prev + 1, buf[prev + 1 : end]))
                end = prev
            if len(lines) >= want or end < 0:
                return lines, start + last_nl + 1, end < 0
        chunk *= 4
