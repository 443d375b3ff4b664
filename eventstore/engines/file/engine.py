"""The file engine: one JSON Lines file per session under a store root (the on-disk format
of every release; see `eventstore.engines.file.layout` for where files live). This module
is the engine itself: its per-session state, the writers' lock, reads, appends and their
durability, sessions; the other jobs are modules of their own:

    session     what the engine keeps per session in this process; the writers' lock
    durability  `durability="fsync"` through the journal; epochs ended on replacement
    logfile     read positions, heads, where committed lines end (the reads all share)
    snapshot    installing a snapshot, the archive, history pictures, pruning
    recovery    torn tails, copy-back after a power loss, damaged last lines, what a
                crashed install left, the repair hold
    overlay     what readers see of a log that lacks what its journal acknowledged
    caches      the fold caches beside a log
    journal     the mirror that makes `durability="fsync"` appends cheap
    groupflush  group commit: durable appends of this process's threads sharing a flush
    layout      where files live, private creation, atomic writes

Readers take no lock and never write: they read from their position to the end of the
file and return complete batches only (a long log piece by piece, `read_some`). Writers
take an exclusive lock on `log.lock` (not the log: a snapshot install replaces the log)
— the `flock` that portalocker takes, taken directly — check the head, set aside and cut
a torn tail (with a warning), append one batch in one `write`, and release.

The writer fast path: each session's lock-file and log descriptors stay open between
appends (at most `MAX_OPEN_SESSIONS` sessions, reset in a forked child). The lock file
holds a generation number that every replacer of the log (snapshot install, repair,
removal) bumps under the lock before replacing anything; a writer that finds the
generation it cached and the log size it left appends with no path lookup and no tail
read (see `SessionState`).

Under `durability="fsync"` an append is made durable through `log.journal`, a mirror of
the log's last appends that is flushed instead of the growing log
(`eventstore.engines.file.journal`). After a power loss, what the log lost and the journal
kept is read laid over the log in memory (`eventstore.engines.file.overlay`) until the
next writer copies it back under the writers' lock. Threads of one process appending to
a session at once share one flush (`turn`, `eventstore.engines.file.groupflush`).
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import msgspec

from eventstore import entropy, process
from eventstore.engines.base import (
    EMPTY_HEAD,
    CacheReader,
    CachingEngine,
    Durability,
    EncodedBatch,
    Head,
    HeadMovedError,
    History,
    IndexEntry,
    IndexingEngine,
    IndexOrder,
    InstallResult,
    KeyEngine,
    LiveView,
    Position,
    PrunedSegment,
    PruningEngine,
    RangedEngine,
    ReadResult,
    RepairHold,
    WriterTurn,
    index_appended,
    index_moved,
)
from eventstore.engines.file import keys
from eventstore.engines.file.caches import (
    open_cache,
    open_cache_parts,
    remove_cache_parts,
    store_cache,
)
from eventstore.engines.file.durability import (
    bump_generation,
    commit_staged,
    make_durable,
    retire_journal,
    scrub_journal,
    stage,
)
from eventstore.engines.file.groupflush import GroupTurn
from eventstore.engines.file.index import FileIndex
from eventstore.engines.file.index_lag import LaggingRows
from eventstore.engines.file.layout import (
    SessionPaths,
    fd_path,
    fsync_dir,
    list_session_ids,
    open_private,
    pread_all,
    write_all,
)
from eventstore.engines.file.logfile import (
    TAIL_CHUNK,
    FilePosition,
    find_head,
    first_seq_of,
    gen_number,
    head_at,
    ident_of,
    live_ident,
    read_generation,
    same_file,
    snapshot_header,
    still_there,
    storage_error,
)
from eventstore.engines.file.overlay import LogRead, look, open_read
from eventstore.engines.file.recovery import (
    FileRepairHold,
    copy_back,
    lacking,
    refuse_damaged_last_line,
    remove_leftover_copies,
    remove_strays,
    set_aside_torn,
)
from eventstore.engines.file.session import (
    GEN_BYTES,
    LOCK_HEAD,
    SessionState,
    lock_at_path,
    lock_exclusive,
    unlock,
)
from eventstore.engines.file.snapshot import (
    FileHistory,
    InstallPlan,
    plan_install,
    prune_archive,
    swap_in,
    take_picture,
)
from eventstore.errors import (
    CorruptLogError,
    EventStoreError,
    InvalidArgumentError,
    StorageError,
    UnsafePathError,
)
from eventstore.format.tail import committed_end
from eventstore.logger import log
from eventstore.session_ids import validate_session_id

__all__ = ["MAX_OPEN_SESSIONS", "FileEngine", "FilePosition", "from_url"]


_REMOVED_PREFIX = ".removed-"  # a session being removed: never an id (ids cannot start with ".")
_HISTORY_TRIES = 50  # lock-free pictures spoiled by installs before a reader takes the lock


_Lagging = tuple[int, "dict[str, str] | None", Head, bool]
"""An append's index row waiting out its lag: the batch's time (µs) and the labels it
sets, the new head, and whether it sets labels or created the session (the row's
`with_labels`)."""

MAX_OPEN_SESSIONS = 64
"""Sessions per engine whose descriptors stay open between calls (two each)."""


class FileEngine(CachingEngine, RangedEngine, PruningEngine, KeyEngine, IndexingEngine):
    """Sessions as JSON Lines files under `root` (created 0700 if missing, unless
    `create` is false: then a missing root is a `StorageError`, for a caller that only
    reads, such as `verify` reading a witness store)."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        durability: Durability = "flush",
        *,
        create: bool = True,
    ) -> None:
        if durability not in ("flush", "fsync"):
            raise InvalidArgumentError(f"durability must be 'flush' or 'fsync', not {durability!r}")
        self.root = Path(root)
        self.durability: Durability = durability
        self.url = os.fspath(self.root)
        _ensure_root(self.root, create)
        self._sessions: dict[str, SessionState] = {}
        # sessions with descriptors open, least recently opened first (bounded)
        self._open: dict[str, SessionState] = {}
        self._guard = threading.Lock()
        self._index = FileIndex(self.root, durable=durability == "fsync")
        self._lagging: LaggingRows[_Lagging] = LaggingRows(
            self._write_lagging, self._index.mark_stale
        )
        process.track(self)

    def reset_after_fork(self) -> None:
        """In a forked child: a lock held by another thread of the parent at the fork
        would be held forever, so fresh ones. The cached descriptors are the parent's
        open file descriptions, and flock does not exclude two users of one description:
        the child closes its copies (the parent's lock, if held, stays with the parent's
        copy) and opens its own."""
        self._guard = threading.Lock()
        self._lagging.reset_after_fork()  # the parent's to write, not the child's
        for sess in self._sessions.values():
            sess.drop_fds()
        self._sessions = {}
        self._open = {}

    def _session(self, session_id: str) -> SessionState:
        sess = self._sessions.get(session_id)
        if sess is None:
            validate_session_id(session_id)
            fresh = SessionState(SessionPaths(self.root, session_id), self.durability == "fsync")
            self._look(fresh)  # before any read or write of it in this process
            with self._guard:
                sess = self._sessions.setdefault(session_id, fresh)
        return sess

    def _look(self, sess: SessionState) -> None:
        """Find the acknowledged appends a power loss took from the log and its journal
        kept (`overlay.look`), without a lock and without writing: readers read them laid
        over the log (`sess.overlay`), the first writer copies them back (`_settle`). A
        session whose log lacks nothing, the usual case, costs the look: no journal, or
        a read of its mirror and the log's tail."""
        paths = sess.paths
        try:
            paths.check_no_links()
            if not os.path.lexists(paths.journal):
                return
            fd = open_private(paths.log, os.O_RDONLY)
            try:
                sess.overlay = look(paths.journal, fd)
            finally:
                os.close(fd)
        except (UnsafePathError, FileNotFoundError):
            return  # no log; or a planted link, which every use of the path refuses
        except OSError as exc:
            # not looked: this use fails, and the next one looks again. Going on would
            # let the next append cut what the journal alone still holds
            raise StorageError(
                f"{paths.journal}: checking the log against the journal after a crash"
                f" failed: {exc.strerror or exc}; nothing was changed, try again",
                exc.errno,
            ) from exc

    def _settle(self, sess: SessionState) -> None:
        """Copy back into the log what the look found it lacking (`sess.overlay`),
        checked again under the writers' lock, which the caller holds: the first write
        of a session in a process, before it changes anything. Readers never do this."""
        if sess.overlay is None:
            return
        paths = sess.paths
        try:
            found = lacking(paths, os.O_RDWR)
            if found is not None:
                self._copy_back(sess, *found)
        except OSError as exc:
            # not settled: this write fails, and the next one tries again. Going on would
            # let it cut what the journal alone still holds
            raise StorageError(
                f"{paths.journal}: copying back what the journal holds after a crash"
                f" failed: {exc.strerror or exc}; nothing was written, try again",
                exc.errno,
            ) from exc
        sess.overlay = None

    def _open_read(self, sess: SessionState) -> LogRead | None:
        """The live log open for a read, as readers see it (`overlay.open_read`: with
        what it lacks of what its journal acknowledged laid over it, in memory); None
        when there is no log. The caller closes it."""
        paths = sess.paths
        paths.check_no_links()
        try:
            fd = open_private(paths.log, os.O_RDONLY)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise storage_error(paths.log, "opening the log", exc) from exc
        try:
            return self._view(sess, fd)
        except BaseException:
            os.close(fd)
            raise

    def _view(self, sess: SessionState, fd: int) -> LogRead:
        """The log open at `fd` as readers see it (`overlay.open_read`)."""
        had = sess.overlay
        try:
            opened, now = open_read(sess.paths.journal, fd, had)
        except OSError as exc:
            raise storage_error(sess.paths.log, "reading the log", exc) from exc
        if now is not had:
            sess.overlay = now
        return opened

    def _copy_back(self, sess: SessionState, fd: int, at: int, data: bytes) -> None:
        """`recovery.copy_back` (writers' lock held): the log changed under what this
        process knew of it."""
        copy_back(sess.paths.log, fd, at, data)
        sess.known = None

    # -- locking ----------------------------------------------------------------------

    def _acquire(self, sess: SessionState, create: bool) -> bool:
        """Take the session's writers' lock (the caller holds `sess.lock`); False, holding
        nothing, when the session directory does not exist and `create` is False.

        Fast: the cached lock descriptor, the generation it had, and proof that it is
        still the file at the lock path (`lock_at_path`: a session directory removed or
        renamed by hand and recreated moves no generation, and a lock on the old file
        excludes nobody). Slow (first use, or either check failed): open the lock file
        at its path; the lock file lives in the session directory, which
        `remove_session` renames away, so after locking it must still be the one at the
        path, else the session was removed meanwhile and the lock is taken again on the
        new one.
        """
        fd = sess.lock_fd
        if fd >= 0:
            lock_exclusive(fd)
            try:
                head = os.pread(fd, LOCK_HEAD, 0)
                if head[:GEN_BYTES] == sess.gen and lock_at_path(sess):
                    sess.head = head
                    return True
            except BaseException:
                unlock(fd)
                raise
            unlock(fd)
            # replaced or removed since (by a replacer, or by hand: the directory removed
            # or renamed, which moves no generation): reopen at the path
            sess.drop_fds()
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
                raise storage_error(paths.lock, "opening the lock file", exc) from exc
            try:
                lock_exclusive(fd)
                if same_file(fd, paths.lock):
                    sess.head = os.pread(fd, LOCK_HEAD, 0)
                    sess.gen = sess.head[:GEN_BYTES]
                    sess.lock_fd = fd
                    # durable appends write the lock file's hints: never ask its times
                    # (`lock_at_path`); else a stat, the cheaper look
                    by_link = fd_path(fd) if self.durability == "fsync" else None
                    sess.lock_mark = by_link or ident_of(fd)
                    self._remember(sess)
                    return True
                unlock(fd)
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)
            sess.known = None  # the session was removed while we waited

    def _remember(self, sess: SessionState) -> None:
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

    @contextmanager
    def _locked(self, sess: SessionState, *, create: bool = True) -> Iterator[bool]:
        """`_acquire` as a context manager, for the paths that are not hot."""
        self._release_group(sess)
        with sess.lock:
            if not self._acquire(sess, create):
                yield False
                return
            try:
                yield True
            finally:
                unlock(sess.lock_fd)

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
        opened, pos, gen, reset = self._open_at(sess, position)
        if opened is None:
            return ReadResult(b"", EMPTY_HEAD, position is not None, where), False
        fd, ident, size, seen = opened.fd, opened.ident, opened.size, opened.seen
        cut = False  # whether this read stopped before the end of the file
        try:
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
                end, last = committed_end(buf, where, start, first)
                if last is not None or want >= size - start:
                    break
                want = min(size - start, want * 4)  # a batch longer than the chunk
            cut = want < size - start and last is not None
            if pos is not None:
                base_seq = pos.base_seq
            else:
                base_seq = first[0].seq if first is not None else first_seq_of(fd, size)
        except OSError as exc:
            raise storage_error(paths.log, "reading the log", exc) from exc
        finally:
            opened.close()
        if start + len(buf) == size and buf[-1:] not in (b"", b"\n"):
            refuse_damaged_last_line(buf, start, where, pos)
        if last is None:
            if pos is not None:
                head = FilePosition(
                    ident, pos.offset, pos.seq, pos.link, pos.h, pos.base_seq, seen, gen
                ).head()
            else:
                empty = FilePosition(ident, 0, 0, "", "", 0, seen, gen)
                head = empty.head() if size else EMPTY_HEAD
            return ReadResult(b"", head, reset, where, start), False
        head = head_at(ident, start + end, last, base_seq, seen, gen)
        data: bytes | memoryview = buf
        if end < len(buf):  # a piece's partial last batch is cut off without a copy
            data = memoryview(buf)[:end] if limit is not None else buf[:end]
        return ReadResult(data, head, reset, where, start), cut

    def _open_at(
        self, sess: SessionState, position: Position | None
    ) -> tuple[LogRead | None, FilePosition | None, int, bool]:
        """The live log open for a read from `position` (None: no log); that position,
        or None when the read starts at the beginning; the generation the read's heads
        carry (`FilePosition.gen`); whether `position` was given but is no longer a
        place in this log (a new file: a snapshot installed, a repair; or an inode
        number reused), which the read then starts over from the beginning of."""
        pos = position if isinstance(position, FilePosition) else None
        if pos is not None:
            opened = self._open_read(sess)
            if opened is None:
                return None, None, -1, True
            try:
                if pos.ident == opened.ident and still_there(opened.fd, pos):
                    return opened, pos, pos.gen, False  # the file `pos.gen` was read for
            except OSError as exc:
                opened.close()
                raise storage_error(sess.paths.log, "reading the log", exc) from exc
            opened.close()
        # read before the log is opened, never after: see `FilePosition.gen`
        gen = read_generation(sess.paths)
        return self._open_read(sess), None, gen, position is not None

    def head(self, session_id: str) -> Head:
        """The last committed line, from the tail of the file alone."""
        sess = self._session(session_id)
        gen = read_generation(sess.paths)  # before the open: see `FilePosition.gen`
        opened = self._open_read(sess)
        if opened is None:
            return EMPTY_HEAD
        try:
            return self._current_head(sess, opened.fd, recover=False, opened=opened, gen=gen)
        except OSError as exc:
            raise storage_error(sess.paths.log, "reading the log", exc) from exc
        finally:
            opened.close()

    @contextmanager
    def live_view(self, session_id: str) -> Iterator[LiveView]:
        """The live log through one open descriptor: its head, and preads of it (the
        descriptor keeps this file even if a compaction renames another over it)."""
        sess = self._session(session_id)
        paths = sess.paths
        where = str(paths.log)
        opened = self._open_read(sess)
        if opened is None:
            yield LiveView(EMPTY_HEAD, lambda a, b: b"", where)
            return
        fd = opened.fd

        def read_span(start: int, end: int) -> bytes:
            try:
                return pread_all(fd, end - start, start)
            except OSError as exc:
                raise storage_error(paths.log, "reading the log", exc) from exc

        try:
            try:
                head = self._current_head(sess, fd, recover=False, opened=opened)
            except OSError as exc:
                raise storage_error(paths.log, "reading the log", exc) from exc
            yield LiveView(head, read_span, where)
        finally:
            opened.close()

    def _current_head(
        self,
        sess: SessionState,
        fd: int,
        *,
        recover: bool,
        opened: LogRead | None = None,
        gen: int = -1,
    ) -> Head:
        """The head of the open log `fd` (a reader's: `opened`, whose `fd` it is); with
        `recover` (writers' lock held) a torn tail is set aside and cut off, and the
        head carries the lock's generation, else `gen` (`FilePosition.gen`)."""
        if opened is None:
            st = os.fstat(fd)
            ident, size = (st.st_dev, st.st_ino), st.st_size
            seen = size
        else:
            ident, size, seen = opened.ident, opened.size, opened.seen
        known = sess.known
        if known is not None:
            pos = known.position
            assert isinstance(pos, FilePosition)
            if pos.ident == ident and pos.offset == size and still_there(fd, pos):
                return known  # nobody wrote since this process did
        where = str(sess.paths.log)
        last, cut = find_head(fd, size, where)
        if cut < size:
            start = max(0, cut - TAIL_CHUNK)
            refuse_damaged_last_line(pread_all(fd, size - start, start), start, where, None)
        if cut < size and recover:
            set_aside_torn(sess.paths.log, fd, cut, size, fsync=self.durability == "fsync")
        if recover:
            gen = gen_number(sess.gen)
        if last is None:  # nothing committed (an empty file, blank lines, a torn first batch)
            return FilePosition(ident, cut, 0, "", "", 0, seen, gen).head() if size else EMPTY_HEAD
        return head_at(ident, cut, last, first_seq_of(fd, cut), seen, gen)

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
            return FileHistory([], [])

        def view(fd: int) -> tuple[int, int, object]:
            opened = self._view(sess, fd)  # (the picture closes `fd` itself)
            return opened.fd, opened.size, opened.overlay

        for _ in range(_HISTORY_TRIES):
            picture = take_picture(paths, view)
            if picture is not None:
                return picture
        with self._locked(sess, create=False) as exists:  # installs without end: wait one out
            picture = take_picture(paths, view) if exists else FileHistory([], [])
            assert picture is not None  # nothing changes while the lock is held
            return picture

    def prune_history(self, session_id: str, before_seq: int) -> list[PrunedSegment]:
        """Unlink, under the writers' lock, the archive files whose last line comes
        before `before_seq` (`snapshot.prune_archive`)."""
        sess = self._session(session_id)
        with self._locked(sess, create=False) as exists:
            return prune_archive(sess.paths, before_seq) if exists else []

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
        if sess.group.holding:
            self._release_group(sess)
        return self._append(sess, batch, expected, None)

    def _append(
        self, sess: SessionState, batch: EncodedBatch, expected: Head, turn: GroupTurn | None
    ) -> Head:
        """`append`, in a writer's turn or none: the locks are released on return unless
        the batch was staged for a group commit, which keeps them for the group."""
        group = sess.group
        sess.lock.acquire()
        keep = False
        try:
            self._acquire(sess, True)
            try:
                head = self._append_locked(sess, batch, expected, turn)
                keep = group.holding
                return head
            except BaseException:
                sess.known = None
                raise
            finally:
                if not keep:
                    unlock(sess.lock_fd)
        finally:
            if not keep:
                sess.lock.release()

    def turn(self, session_id: str) -> WriterTurn | None:
        """With `durability="fsync"`, a writer's turn whose append shares a flush with
        the writers of this process queued behind it (group commit:
        `eventstore.engines.file.groupflush`); else none (`Engine.turn`)."""
        if self.durability != "fsync":
            return None
        sess = self._sessions.get(session_id) or self._session(session_id)
        return GroupTurn(
            self,
            session_id,
            sess.group,
            sess.paths.log_str,
            partial(self._append_in_turn, sess),
            partial(self._settle_group, sess),
        )

    def _append_in_turn(
        self, sess: SessionState, turn: GroupTurn, batch: EncodedBatch, expected: Head
    ) -> Head:
        with sess.group.commit_lock:
            if sess.group.holding:  # staged batches before this one: the group's locks
                return self._append_held(sess, turn, batch, expected)
            return self._append(sess, batch, expected, turn)

    def _append_held(
        self, sess: SessionState, turn: GroupTurn, batch: EncodedBatch, expected: Head
    ) -> Head:
        """Append within a group that holds the locks (nobody else wrote: the head is
        the last staged batch's): staged too while others are queued, else staged and
        the group committed (`durability.commit_staged`)."""
        group, head = sess.group, sess.known
        if head is None or head.position is None or not head.same_chain_point(expected):
            self._commit_held(sess)  # (a caller with another head: judged as a lone writer)
            return self._append(sess, batch, expected, turn)
        start, ident = head.size, head.position.ident  # type: ignore[attr-defined]
        last = not group.others_queued()
        if not stage(sess, batch, start, ident):
            self._commit_held(sess)  # the mirror cannot take it: a lone writer's append
            return self._append(sess, batch, expected, turn)
        ticket = group.stage(batch.data, start)
        new = sess.known = _head_after(head, batch, ident, start, gen_number(sess.gen))
        if not last:
            turn.ticket = ticket
            return new
        try:
            self._commit_held(sess)
        finally:
            group.wait(ticket)  # (settled: its own outcome is what the commit raised)
        return new

    def _commit_held(self, sess: SessionState) -> None:
        """Commit the staged group and release the locks it held."""
        try:
            commit_staged(sess, sess.log_fd)
        except BaseException:
            sess.known = None  # the log holds none of the group
            raise
        finally:
            try:
                unlock(sess.lock_fd)
            finally:
                sess.lock.release()

    def _settle_group(self, sess: SessionState) -> bool:
        """Commit a group its last writer left staged (it raised, or had nothing to
        write); True when that failed (its writers are told: `Group.wait`)."""
        with sess.group.commit_lock:
            if not sess.group.holding:
                return False
            try:
                self._commit_held(sess)
            except EventStoreError as exc:
                log.debug("eventstore: %s: a group commit failed: %s", sess.paths.log, exc)
                return True
            return False

    def _release_group(self, sess: SessionState) -> None:
        """Before waiting for the session's locks outside a writer's turn: commit a group
        that holds them (its last writer may be queued behind the caller's own hold on
        the store's session lock; see `eventstore.engines.file.groupflush`)."""
        if sess.group.holding:
            self._settle_group(sess)

    def _append_locked(
        self, sess: SessionState, batch: EncodedBatch, expected: Head, turn: GroupTurn | None
    ) -> Head:
        if sess.overlay is not None:  # a power loss took acknowledged appends from the log
            self._settle(sess)
        paths = sess.paths
        fd = sess.log_fd
        if fd < 0:
            try:
                fd = sess.log_fd = open_private(paths.log, os.O_RDWR | os.O_APPEND)
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise storage_error(paths.log, "opening the log", exc) from exc
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
                        and fd_path(fd) == sess.log_link
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
                raise storage_error(paths.log, "recovering the tail", exc) from exc
        if head.seq != expected.seq or head.link != expected.link:  # not same_chain_point
            sess.known = head if head.position is not None else None
            raise HeadMovedError(str(paths.log), expected, head)
        created = fd < 0
        if created:
            # the row first: a crash after the log is created never hides the session
            self._index.put(
                index_appended(
                    None, sess.paths.session_id, batch.ts_us or _now_us(), batch.labels, EMPTY_HEAD
                ),
                sync=self.durability == "fsync",
            )
            fd, head = self._create(sess)
            sess.log_fd = fd
        pos = head.position
        start = head.size
        ident = pos.ident if pos is not None else ident_of(fd)  # type: ignore[attr-defined]
        if (
            turn is not None
            and not created
            and sess.group.others_queued()
            and stage(sess, batch, start, ident)  # a group commit: the locks stay held
        ):
            turn.ticket = sess.group.stage(batch.data, start)
            sess.known = new = _head_after(head, batch, ident, start, gen_number(sess.gen))
            return new
        try:
            self._write(sess, fd, batch, start, ident)
        except BaseException:
            if created:  # a call that writes nothing leaves no session behind
                self._discard_new_session(sess)
            raise
        sess.known = new = _head_after(head, batch, ident, start, gen_number(sess.gen))
        if sess.log_link is None and self.durability == "fsync":
            # the descriptor is the live log (checked by path above, or just created):
            # from the next append on, the fast path asks the kernel, not the log's stat
            sess.log_link = fd_path(fd)
        self._index_appended(sess.paths.session_id, batch, new, created)
        return new

    def _create(self, sess: SessionState) -> tuple[int, Head]:
        """Create the log file (the first append of a session)."""
        paths = sess.paths
        try:
            fd = open_private(paths.log, os.O_RDWR | os.O_CREAT | os.O_APPEND)
        except OSError as exc:
            raise storage_error(paths.log, "creating the log", exc) from exc
        try:
            if self.durability == "fsync":  # the new name must survive power loss too
                fsync_dir(paths.dir)
                fsync_dir(paths.dir.parent)
                fsync_dir(paths.dir.parent.parent)  # the store root holds `sessions`
        except OSError as exc:
            os.close(fd)
            self._discard_new_session(sess)
            raise storage_error(paths.log, "creating the log", exc) from exc
        return fd, EMPTY_HEAD

    def _discard_new_session(self, sess: SessionState) -> None:
        """Undo the first append of a session that failed (writers' lock held): remove the
        empty log this call created and, when nothing else is kept for the session, its
        directory (renamed away first, as `remove_session` does, so a writer waiting on
        the lock notices and starts over). Best effort, step by step: the error being
        raised is the one the caller needs, and a full disk, which refused the append,
        refuses the generation's bump too, which must not keep the empty log (a listed
        session) behind."""
        paths = sess.paths
        sess.known = None
        sess.drop_log_fd()  # the cached descriptor may name the file removed here
        try:
            if os.path.lexists(paths.log):
                if os.lstat(paths.log).st_size:
                    return  # bytes a failed cut-back left: the next writer sets them aside
                try:
                    # other processes' cached descriptors: reopen (the journal goes below).
                    # None holds this new file (created under the lock): the lock path's
                    # check (`lock_at_path`) and the log's own catch what a failed bump misses
                    bump_generation(sess, retire=False)
                except OSError:
                    pass
                os.unlink(paths.log)
            if os.path.lexists(paths.archive):
                return
            trash = paths.dir.parent / f"{_REMOVED_PREFIX}{entropy.token_hex()}"
            os.rename(paths.dir, trash)
            sess.gen = b"removed"  # this process's lock descriptor too: reopen at the path
            import shutil  # here: it imports bz2 and lzma, ~2 ms of every `import`

            shutil.rmtree(trash, ignore_errors=True)
        except OSError:
            pass

    def _write(
        self, sess: SessionState, fd: int, batch: EncodedBatch, start: int, ident: tuple[int, int]
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
                make_durable(sess, fd, batch, start, ident)
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

    def install_snapshot(
        self, session_id: str, line: bytes, covers: Head, *, keep_history: bool
    ) -> InstallResult:
        """Swap in a new log (the snapshot + lines after `covers`) under the writers'
        lock; the steps on the files are `eventstore.engines.file.snapshot`'s."""
        sess = self._session(session_id)
        paths = sess.paths
        with self._locked(sess):
            head, plan = self._plan_install(sess, covers, keep_history)
            archived = swap_in(
                paths,
                line,
                covers.seq,
                plan,
                lambda: bump_generation(sess),  # before the swap: see bump_generation
                keep_history=keep_history,
            )
            if not keep_history:
                try:
                    scrub_journal(sess)
                except OSError as exc:  # the swap is done: what is left is a stale mirror
                    log.warning("eventstore: %s: zeroing the journal failed: %s",
                                paths.journal, exc)  # fmt: skip
            size = len(line) + len(plan.tail)
            h = head.h if plan.tail else line.rstrip(b"\n")[-18:-2].decode("ascii")
            new = FilePosition(
                live_ident(paths.log),
                size,
                head.seq,
                head.link,
                h,
                covers.seq,
                size,
                gen_number(sess.gen),  # the swap's own: the lock is still held
            ).head()
            sess.known = new
            self._index_moved(session_id, new)
        name = str(archived) if archived else None
        return InstallResult(new, name, head.size, size, archived)

    def _plan_install(
        self, sess: SessionState, covers: Head, keep_history: bool
    ) -> tuple[Head, InstallPlan]:
        """Clean up after a crashed install, check that `covers` is still in the live
        log (HeadMovedError if not) and read what the install swaps in (writers' lock
        held)."""
        self._settle(sess)
        paths = sess.paths
        where = str(paths.log)
        try:
            remove_strays(paths, live_ident(paths.log))
        except OSError as exc:
            raise StorageError(f"{paths.dir}: cleaning up after a crash failed: {exc}") from exc
        try:
            fd = open_private(paths.log, os.O_RDWR | os.O_APPEND)
        except FileNotFoundError:
            raise HeadMovedError(where, covers, EMPTY_HEAD) from None
        except OSError as exc:
            raise storage_error(paths.log, "opening the log", exc) from exc
        sess.known = None
        try:
            head = self._current_head(sess, fd, recover=True)
            pos = covers.position
            if (
                not isinstance(pos, FilePosition)
                or pos.ident != ident_of(fd)
                or head.seq < covers.seq
                or not still_there(fd, pos)
            ):
                raise HeadMovedError(where, covers, head)
            remove_leftover_copies(paths.archive, fd)
            return head, plan_install(paths, fd, head, pos.offset, keep_history=keep_history)
        except OSError as exc:
            raise storage_error(paths.log, "reading the log", exc) from exc
        finally:
            os.close(fd)

    @contextmanager
    def hold(self, session_id: str) -> Iterator[RepairHold]:
        """The writers' lock, for a repair of the live log."""
        sess = self._session(session_id)
        with self._locked(sess, create=False) as exists:
            sess.known = None
            if exists:
                self._settle(sess)
            try:
                yield FileRepairHold(sess.paths, exists, lambda: bump_generation(sess))
            finally:
                sess.known = None
                if exists:
                    self._index_moved(session_id, self.head(session_id))

    # -- sessions ---------------------------------------------------------------------

    def load_key_slot(self, dk: str) -> bytes | None:
        """The key slot `dk` (`KeyEngine`, `eventstore.engines.file.keys`)."""
        with self._key_slots("reading key slot", dk):
            return keys.load_slot(self.root, dk)

    def create_key_slot(self, dk: str, data: bytes) -> bool:
        """Create the key slot `dk` unless it exists (`KeyEngine`)."""
        with self._key_slots("creating key slot", dk):
            return keys.create_slot(self.root, dk, data)

    def replace_key_slot(self, dk: str, data: bytes, expected: bytes | None = None) -> bool:
        """Replace the key slot `dk`, if it holds `expected` when given (`KeyEngine`)."""
        with self._key_slots("replacing key slot", dk):
            return keys.replace_slot(self.root, dk, data, expected)

    def list_key_slots(self) -> list[str]:
        """Every key slot's id (`KeyEngine`)."""
        with self._key_slots("listing key slots", None):
            return keys.list_slots(self.root)

    def remove_key_slot(self, dk: str, data: bytes) -> bool:
        """Remove the key slot `dk` if it holds `data` (`KeyEngine`)."""
        with self._key_slots("removing key slot", dk):
            return keys.remove_slot(self.root, dk, data)

    @contextmanager
    def _key_slots(self, doing: str, dk: str | None) -> Iterator[None]:
        """An OSError of the key slots' files as a StorageError naming the slot."""
        try:
            yield
        except OSError as exc:
            where = self.root / keys.KEYS_DIR / (dk or "")
            raise storage_error(where, doing, exc) from exc

    def list_sessions(self) -> list[str]:
        """Every session with a log file, by original id."""
        return list_session_ids(self.root)

    def remove_session(self, session_id: str) -> bool:
        """Rename the session directory away under its lock (one atomic step: readers see
        the whole session or none of it), then delete what was renamed."""
        sess = self._session(session_id)
        paths = sess.paths
        trash = paths.dir.parent / f"{_REMOVED_PREFIX}{entropy.token_hex()}"
        with self._locked(sess, create=False) as exists:
            if not exists:
                return False
            had = os.path.lexists(paths.log) or os.path.lexists(paths.archive)
            try:
                # other processes' cached descriptors: reopen (the journal goes with it)
                bump_generation(sess, retire=False)
                os.rename(paths.dir, trash)
                fsync_dir(paths.dir.parent)
            except OSError as exc:
                raise storage_error(paths.dir, "removing the session", exc) from exc
            # this process's too: a generation no lock file holds (8 bytes or none)
            sess.gen = b"removed"
            self._lagging.discard(session_id)
            self._index.drop(session_id)
        # what was renamed is no session any more: delete it, and what a removal that
        # crashed before finishing left behind
        for name in os.listdir(trash.parent):
            if name.startswith(_REMOVED_PREFIX):
                import shutil  # here: it imports bz2 and lzma, ~2 ms of every `import`

                shutil.rmtree(trash.parent / name, ignore_errors=True)
        return had

    # -- the session index (eventstore.engines.file.index) ------------------------------

    def _index_appended(
        self, session_id: str, batch: EncodedBatch, new: Head, created: bool
    ) -> None:
        """The row after an append (writers' lock held). A session's first append and
        a labels batch are written at once; any other append's row waits
        (`index_lag`: for this engine's next page, `close`, the process's exit, or at
        most `INDEX_LAG` seconds), so no such append waits for the index."""
        # what the row is made of (made only when written: most are replaced unwritten)
        forced = created or batch.labels is not None
        lagging = (batch.ts_us or _now_us(), batch.labels, new, forced)
        if not forced:
            self._lagging.add(session_id, lagging)
            return
        self._lagging.discard(session_id)
        self._write_lagging([(session_id, lagging)])

    def _write_lagging(self, rows: list[tuple[str, _Lagging]], wait: float | None = None) -> None:
        self._index.put_appended(
            [_lagging_row(sid, lagging) for sid, lagging in rows],
            busy_ms=None if wait is None else round(wait * 1000),
        )

    def _index_moved(self, session_id: str, head: Head) -> None:
        """The row after the live log was replaced (writers' lock held)."""
        self._lagging.flush()  # an append's row written later would undo this one
        old = self._index.get(session_id)
        if old is not None:
            self._index.put(index_moved(old, head))

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
        """A page from the index file, each row checked against its log (one stat) and
        corrected or dropped when stale."""
        self._lagging.flush()  # this process's own writes are listed as they are
        page: list[IndexEntry] = []
        for entry in self._index.rows(order, after, prefix, updated_since_us, labels or {}):
            fresh = self._checked(entry)
            if fresh is not None:
                page.append(fresh)
                if limit is not None and len(page) >= limit:
                    break
        page.sort(key=lambda e: e.sort_key(order), reverse=order != "id")
        return page

    def _checked(self, entry: IndexEntry) -> IndexEntry | None:
        """`entry` if its log still has its size; else corrected from the log (written
        back), or None (dropped) when the session has no committed line."""
        paths = SessionPaths(self.root, entry.session_id)
        try:
            st = os.lstat(paths.log_str)
        except FileNotFoundError:
            st = None
        except OSError as exc:
            raise storage_error(paths.log, "checking the log", exc) from exc
        if st is not None and st.st_size == entry.bytes and entry.last_seq:
            return entry
        try:
            head = self.head(entry.session_id)
        except EventStoreError:
            return entry  # a damaged log is still listed (verify and repair name it)
        if head.seq == 0:
            if not os.path.lexists(paths.archive):
                self._index.drop(entry.session_id)
                return None
            return entry
        fixed = index_moved(entry, head)
        if st is not None and head.seq > entry.last_seq:  # appended to since: when, by the log
            fixed = msgspec.structs.replace(
                fixed, updated_us=max(entry.updated_us, st.st_mtime_ns // 1000)
            )
        if fixed != entry:
            self._index.put(fixed)
        return fixed

    def index_stale(self) -> bool:
        """Whether the index may lack a session (see `eventstore.engines.file.index`),
        asked after this process's waiting rows are written: a write the index refuses
        marks it stale, and the page asking must rebuild it first."""
        self._lagging.flush()
        return self._index.stale()

    def replace_index(self, entries: Sequence[IndexEntry], started_us: int) -> None:
        """Merge a rebuild into the index file and lift its stale marker."""
        self._index.replace(entries, started_us)

    # -- the fold cache -----------------------------------------------------------------

    def open_cache(self, session_id: str, name: str) -> tuple[Head, CacheReader] | None:
        """The session's cache `name`, if its head is still in the live log
        (`eventstore.engines.file.caches`)."""
        return open_cache(self._session(session_id).paths, name)

    def open_cache_parts(
        self, session_id: str, name: str, count: int
    ) -> Iterator[tuple[Head, CacheReader] | None]:
        """The files of the session's cache parts `name#0` .. `name#<count - 1>`, opened
        with `open_cache`'s care but no live-log check (`eventstore.engines.file.caches`)."""
        return open_cache_parts(self._session(session_id).paths, name, count)

    def store_cache(self, session_id: str, name: str, head: Head, data: list[bytes]) -> None:
        """Write the session's cache `name` atomically (0600), with where in the log
        `head` is (`eventstore.engines.file.caches`)."""
        store_cache(self._session(session_id).paths, name, head, data)

    keeps_cache_parts = True

    def remove_cache_parts(self, session_id: str, name: str, start: int) -> None:
        """Remove the files of the parts `name#k`, k >= `start`, of the session's cache
        (`eventstore.engines.file.caches`)."""
        remove_cache_parts(self._session(session_id).paths, name, start)

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
            self._release_group(sess)
            with sess.lock:
                self._release(sess)
        self._lagging.stop()
        self._index.close()

    def _release(self, sess: SessionState) -> None:
        """Retire the session's epoch if this process appended durably, and close its
        descriptors (the caller holds `sess.lock` and no longer keeps `sess`)."""
        if sess.epoch is not None and sess.lock_fd >= 0:
            try:
                if self._acquire(sess, False):
                    try:
                        retire_journal(sess)
                    finally:
                        unlock(sess.lock_fd)
            except (OSError, EventStoreError) as exc:
                log.debug("eventstore: %s: retiring the epoch failed: %s",
                          sess.paths.journal, exc)  # fmt: skip
        sess.drop_fds()

    def let_go(self, session_id: str) -> None:
        """Free what this process keeps of the session (its descriptors, what it last
        knew of the log), as `close` does for every session: the store dropped it past
        its `cached_sessions` bound. One a thread is using stays (freed by a later drop or
        by close), and so does one with acknowledged appends a power loss took, until a
        writer copies them back (a fresh look would find them again, at a cost)."""
        sess = self._sessions.get(session_id)
        if sess is None or not sess.lock.acquire(blocking=False):
            return
        try:
            if sess.overlay is not None:
                return
            with self._guard:
                if self._sessions.get(session_id) is not sess:
                    return
                del self._sessions[session_id]
                if self._open.get(session_id) is sess:
                    del self._open[session_id]
            self._release(sess)
        finally:
            sess.lock.release()

    @property
    def kept_sessions(self) -> int:
        """How many sessions this engine keeps state for in this process: under a store,
        at most about its `cached_sessions` (the store lets go of those it drops)."""
        return len(self._sessions)


def _head_after(
    head: Head, batch: EncodedBatch, ident: tuple[int, int], start: int, gen: int
) -> Head:
    """The head after `batch`, appended at `start` of the log `ident` whose head was
    `head`, under the lock file's generation `gen`."""
    size = start + len(batch.data)
    base = head.base_seq or batch.first_seq
    h = batch.hashes[-1]
    return Head(
        batch.last_seq,
        batch.link,
        h,
        FilePosition(ident, size, batch.last_seq, batch.link, h, base, size, gen),
        size,
        base,
    )


def _lagging_row(session_id: str, lagging: _Lagging) -> tuple[IndexEntry, bool]:
    """The row `put_appended` writes for a lagging append."""
    ts, labels, head, forced = lagging
    return index_appended(None, session_id, ts, labels, head), forced


def _now_us() -> int:
    return entropy.time_ns() // 1000


def from_url(url_or_path: str | os.PathLike[str], **options: Any) -> FileEngine:
    """The file engine of a path or a `file://` URL (`file:///abs/dir`)."""
    text = os.fspath(url_or_path)
    if text.startswith("file://"):
        rest = text[len("file://") :]
        if rest and not rest.startswith("/"):
            host, _, path = rest.partition("/")
            if host not in ("", "localhost"):
                raise InvalidArgumentError(
                    f"{text}: a file:// URL names a local path (file:///abs/dir)"
                )
            rest = "/" + path
        text = rest
    if not text:
        raise UnsafePathError("an empty store path would mean the current directory; give one")
    durability = options.pop("durability", "flush")
    create = options.pop("create", True)
    if options:
        raise InvalidArgumentError(f"unknown file engine options: {', '.join(sorted(options))}")
    return FileEngine(text, durability, create=bool(create))


def _ensure_root(root: Path, create: bool) -> None:
    try:
        st = os.stat(root)
    except NotADirectoryError as exc:
        raise UnsafePathError(f"store root {root}: a part of the path is not a directory") from exc
    except FileNotFoundError as exc:
        if not create:
            raise StorageError(f"no store at {root} (directory not found)", exc.errno) from exc
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
    except OSError as exc:  # e.g. a directory on the path this user cannot search
        raise storage_error(root, "opening the store root", exc) from exc
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePathError(f"store root {root} exists and is not a directory")
