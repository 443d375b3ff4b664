"""One session's log file: the writers' lock, atomic appends, incremental reads, recovery.

This is the storage engine behind the session API. The face talks to it only through
`SessionLog` (read from a cursor; take the writers' lock; append; replace), so another
engine can stand beside it.

Readers take no lock: they read from their cursor to the end of the file and consume
complete batches only. Writers take an exclusive portalocker lock on `log.lock` (not
the log: compaction replaces the log), re-open the log if it was replaced, truncate a
torn tail (with a warning), append one batch in one `write`, and release.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import compress
from operator import attrgetter
from pathlib import Path
from typing import Literal

import msgspec
import portalocker

from .errors import CorruptLogError, EventStoreError, StorageError
from .events import HASH_SUFFIX_LEN, Event, EventCodec, LineHead, Snapshot, SnapshotHead, link_of
from .layout import SessionPaths, fsync_dir, open_private, write_all

__all__ = ["Cursor", "Durability", "FileSessionLog", "LogWriter", "ReadResult", "SessionLog"]

log = logging.getLogger("eventstore")

Durability = Literal["flush", "fsync"]
_TAIL_CHUNK = 1 << 13
_EXCLUSIVE = portalocker.LockFlags.EXCLUSIVE
# fdatasync flushes the data and the size (all a reader needs), not the times: ~10%
# faster per append than fsync on Linux; platforms without it (macOS) fall back to fsync
_HAS_FDATASYNC = hasattr(os, "fdatasync")


def _datasync(fd: int) -> None:
    if _HAS_FDATASYNC:
        os.fdatasync(fd)
    else:
        os.fsync(fd)


@dataclass(frozen=True, slots=True)
class Cursor:
    """A reader's position: which file, the byte after the last complete batch, its seq."""

    ident: tuple[int, int] = (0, 0)
    offset: int = 0
    seq: int = 0
    link: str = ""
    h: str = ""  # the `h` closing the line before `offset`: proves the file is the same


EMPTY = Cursor()


@dataclass(frozen=True, slots=True)
class ReadResult:
    """Events read after a cursor. `reset`: the file was replaced and `events` start at
    its beginning (a snapshot), so a fold must restart from them."""

    events: list[Event]
    cursor: Cursor
    reset: bool


class SessionLog:
    """The engine interface the face uses. `FileSessionLog` is the JSONL file engine."""

    def exists(self) -> bool:
        """Whether the session has a log at all."""
        raise NotImplementedError

    def read(
        self, cursor: Cursor, decoder: msgspec.json.Decoder[Event], part: str | None = None
    ) -> ReadResult:
        """Events after `cursor` (complete batches only); `part`: the one projection
        the caller folds, which lets an engine read less of a snapshot."""
        raise NotImplementedError

    def last_seq(self) -> int:
        """The last committed sequence number (0: no events)."""
        raise NotImplementedError

    def writer(self) -> AbstractContextManager[LogWriter]:
        """Hold the writers' lock; the writer's `head` is the last committed event."""
        raise NotImplementedError


class LogWriter:
    """Held while the writers' lock is held; `head` is the last committed event."""

    head: Cursor

    def append(self, events: Sequence[Event], key: str | None = None) -> list[Event]:
        """Append one batch atomically; returns the events as stamped (seq, ts, h)."""
        raise NotImplementedError


_thread_locks: dict[str, threading.Lock] = {}
_thread_locks_guard = threading.Lock()


def _thread_lock(path: Path) -> threading.Lock:
    # flock already excludes threads (each lock opens its own file description); this
    # lock only spares threads of one process from spinning on the file lock.
    key = os.fspath(path)
    with _thread_locks_guard:
        lock = _thread_locks.get(key)
        if lock is None:
            lock = _thread_locks[key] = threading.Lock()
        return lock


class FileSessionLog(SessionLog):
    """The JSON Lines file of one session."""

    def __init__(self, paths: SessionPaths, codec: EventCodec, durability: Durability) -> None:
        self.paths = paths
        self.path = paths.log
        self.codec = codec
        self.durability = durability
        # where the last writer of this process left the file: when the file has not
        # changed since, the next writer needs no tail read at all
        self.last_head: Cursor | None = None

    def exists(self) -> bool:
        """Whether the log file exists."""
        return os.path.lexists(self.path)

    def last_seq(self) -> int:
        """The last committed sequence number, from the tail of the file alone."""
        self.paths.check_no_links()
        try:
            fd = open_private(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return 0
        except OSError as exc:
            raise _storage_error(self.path, "opening the log", exc) from exc
        try:
            head, _ = find_head(fd, os.fstat(fd).st_size, self)
        except OSError as exc:
            raise _storage_error(self.path, "reading the log", exc) from exc
        finally:
            os.close(fd)
        return 0 if head is None else head.seq

    # -- reading ----------------------------------------------------------------------

    def first_seq(self, ident: tuple[int, int]) -> int:
        """The sequence number of the first line of the file `ident` (0 if it is gone)."""
        try:
            fd = open_private(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return 0
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != ident:
                return 0
            chunk = _TAIL_CHUNK
            while True:
                buf = os.pread(fd, chunk, 0)
                nl = buf.find(b"\n")
                if nl >= 0:
                    return self.codec.head_decoder.decode(buf[:nl]).seq
                if len(buf) < chunk:
                    return 0
                chunk *= 4
        except (msgspec.DecodeError, msgspec.ValidationError):
            return 0
        finally:
            os.close(fd)

    def read(
        self, cursor: Cursor, decoder: msgspec.json.Decoder[Event], part: str | None = None
    ) -> ReadResult:
        """Events after `cursor`, up to the last complete batch.

        `part`: the one projection the caller folds. When the read starts at an opening
        snapshot, only that projection's state is read from it (see SnapshotHead).
        """
        self.paths.check_no_links()
        try:
            fd = open_private(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return ReadResult([], cursor, False)
        except OSError as exc:
            raise _storage_error(self.path, "opening the log", exc) from exc
        try:
            st = os.fstat(fd)
            ident = (st.st_dev, st.st_ino)
            reset = False
            if ident != cursor.ident or not _still_there(fd, cursor):
                # a new file (compaction), or the same inode number reused by one
                reset = cursor.ident != (0, 0)
                cursor = Cursor(ident)
            size = st.st_size
            if size < cursor.offset:
                raise CorruptLogError(
                    self.path, size, cursor.seq, f"log shrank below a read position {cursor.offset}"
                )
            lead: list[Event] = []
            if part is not None and cursor.offset == 0 and size:
                snap = _snapshot_part(fd, part)
                if snap is not None:
                    lead = [snap]
                    cursor = Cursor(ident, snap.length + 1, snap.seq, snap.base_h, snap.h)
            buf = _pread_all(fd, size - cursor.offset, cursor.offset)
        except OSError as exc:
            raise _storage_error(self.path, "reading the log", exc) from exc
        finally:
            os.close(fd)
        events, end = self.parse(buf, cursor, decoder)
        if not events:
            return ReadResult(lead, cursor, reset)
        last = events[-1]
        after = Cursor(ident, cursor.offset + end, last.seq, link_of(last), last.h)
        return ReadResult([*lead, *events], after, reset)

    def parse(
        self, buf: bytes, cursor: Cursor, decoder: msgspec.json.Decoder[Event]
    ) -> tuple[list[Event], int]:
        """Decode the complete batches in `buf`, read at `cursor.offset` (see parse_lines)."""
        return parse_lines(buf, cursor, decoder, self.codec, self.path)

    # -- writing ----------------------------------------------------------------------

    @contextmanager
    def writer(self) -> Iterator[FileLogWriter]:
        """Hold the writers' lock; yield a writer positioned after the last complete batch.

        The log file itself is created by the first append, so a refused write leaves
        no session behind.
        """
        with self.locked():
            w = FileLogWriter(self)
            try:
                yield w
            finally:
                self.last_head = w.head if w.fd is not None else None
                w.close()

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the writers' lock only (no tail recovery): for repair tools and writers."""
        with _thread_lock(self.paths.lock), self._file_lock():
            yield

    @contextmanager
    def _file_lock(self) -> Iterator[None]:
        try:
            self.paths.create()
            lock_fd = open_private(self.paths.lock, os.O_RDWR | os.O_CREAT)
        except OSError as exc:
            raise _storage_error(self.paths.lock, "opening the lock file", exc) from exc
        try:
            portalocker.lock(lock_fd, _EXCLUSIVE)
            try:
                yield
            finally:
                portalocker.unlock(lock_fd)
        finally:
            os.close(lock_fd)


def _storage_error(path: object, doing: str, exc: OSError) -> Exception:
    if isinstance(exc, EventStoreError):
        return exc
    return StorageError(f"{path}: {doing} failed: {exc.strerror or exc}", exc.errno)


class FileLogWriter(LogWriter):
    """Appends to a log while its lock is held."""

    def __init__(self, log_: FileSessionLog) -> None:
        self.log = log_
        self.fd: int | None = None
        try:
            self.fd = open_private(log_.path, os.O_RDWR | os.O_APPEND)
        except FileNotFoundError:
            self.head = EMPTY
            return
        except OSError as exc:
            raise _storage_error(log_.path, "opening the log", exc) from exc
        try:
            known = log_.last_head
            st = os.fstat(self.fd)
            if (
                known is not None
                and known.ident == (st.st_dev, st.st_ino)
                and known.offset == st.st_size
                and _still_there(self.fd, known)
            ):
                self.head = known  # nobody wrote since this process did
            else:
                self.head = self._recover_tail(self.fd)
        except OSError as exc:
            self.close()
            raise _storage_error(log_.path, "recovering the tail", exc) from exc
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Close the log file (the lock is released by the log's context manager)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def _create(self) -> int:
        """Create the log file (first append of a session)."""
        paths = self.log.paths
        try:
            fd = open_private(paths.log, os.O_RDWR | os.O_CREAT | os.O_APPEND)
        except OSError as exc:
            raise _storage_error(paths.log, "creating the log", exc) from exc
        try:
            if self.log.durability == "fsync":  # the new name must survive power loss too
                fsync_dir(paths.dir)
                fsync_dir(paths.dir.parent)
                fsync_dir(paths.dir.parent.parent)  # the store root holds `sessions`
            st = os.fstat(fd)
        except OSError as exc:
            os.close(fd)
            raise _storage_error(paths.log, "creating the log", exc) from exc
        self.fd = fd
        self.head = Cursor((st.st_dev, st.st_ino), 0, 0, "")
        return fd

    def _recover_tail(self, fd: int) -> Cursor:
        """The last committed line; a torn tail (partial line or batch) is truncated."""
        path = self.log.path
        st = os.fstat(fd)
        ident = (st.st_dev, st.st_ino)
        size = st.st_size
        head, cut = find_head(fd, size, self.log)
        if cut < size:
            log.warning(
                "eventstore: %s: truncating a torn tail of %d bytes at byte %d",
                path,
                size - cut,
                cut,
            )
            os.ftruncate(fd, cut)
            if self.log.durability == "fsync":
                os.fsync(fd)
        if head is None:
            return Cursor(ident, 0, 0, "")
        link = (head.base_h or "") if head.type == "snapshot" else head.h
        return Cursor(ident, cut, head.seq, link, head.h)

    def append(self, events: Sequence[Event], key: str | None = None) -> list[Event]:
        """Append one batch; returns the stamped events (seq, ts, h set)."""
        if not events:
            return []
        if self.fd is None:
            self._create()
        head = self.head
        data, stamped, link = self.log.codec.encode_batch(
            events, head.seq + 1, head.link, datetime.now(UTC), key
        )
        self.write(data)
        self.head = Cursor(
            head.ident, head.offset + len(data), stamped[-1].seq, link, stamped[-1].h
        )
        return stamped

    def write(self, data: bytes) -> None:
        """Write bytes at the end; on failure cut them back off and raise StorageError."""
        fd = self.fd if self.fd is not None else self._create()
        start = self.head.offset
        try:
            write_all(fd, data)
        except OSError as exc:
            try:
                os.ftruncate(fd, start)
            except OSError:
                pass  # the next writer truncates the torn tail
            raise StorageError(
                f"{self.log.path}: append at byte {start} failed: {exc.strerror}", exc.errno
            ) from exc
        if self.log.durability == "fsync":
            try:
                _datasync(fd)
            except OSError as exc:
                raise StorageError(
                    f"{self.log.path}: fsync after byte {start} failed: {exc.strerror}"
                    " (the append may or may not be durable)",
                    exc.errno,
                ) from exc


def parse_lines(
    buf: bytes,
    cursor: Cursor,
    decoder: msgspec.json.Decoder[Event],
    codec: EventCodec,
    path: object,
) -> tuple[list[Event], int]:
    """Decode the complete batches in `buf` (read at `cursor.offset`).

    Returns the events and the length of `buf` they occupy. Raises CorruptLogError
    for anything but a torn tail.
    """
    end = buf.rfind(b"\n") + 1
    if end == 0:
        return [], 0
    region = buf if end == len(buf) else buf[:end]
    try:
        events = decoder.decode_lines(region)
    except (msgspec.DecodeError, msgspec.ValidationError):
        events = _decode_slow(region, cursor, decoder, codec, path)
    if not events:
        return [], end  # blank lines only (msgspec skips them; `verify` reports them)
    start = cursor.offset
    commit = _check_regular(events, cursor.seq + 1, start)
    slow = False
    if commit is None:  # something to look at closely: find it, or confirm it is fine
        commit, slow = _check_each(events, cursor.seq + 1, start, region, path)
    if slow:  # an old-version line decoded under a newer shape: upcast it exactly
        events = _decode_slow(region, cursor, decoder, codec, path)
    if commit < len(events):
        torn = len(events) - commit
        del events[commit:]
        pos = end - 1
        while torn:  # walk back over the torn batch's lines (blank lines hold no event)
            prev = region.rfind(b"\n", 0, pos)
            if region[prev + 1 : pos].strip():
                torn -= 1
            pos = prev
        end = pos + 1
    return events, end


_get_seq = attrgetter("seq")
_get_more = attrgetter("more")
_get_v = attrgetter("v")


def _check_regular(events: list[Event], expected: int, start: int) -> int | None:
    """How many events form complete batches, if the run is regular: sequence numbers
    contiguous from `expected`, batches well formed, every line of version 1 and of a
    type still at version 1, no snapshot but at the start of a file. None means "check
    each line" (`_check_each`).

    This is the fast path of every load: a few C-level passes instead of a Python loop.
    """
    n = len(events)
    seqs = list(map(_get_seq, events))
    first = 1 if start == 0 and type(events[0]) is Snapshot else 0
    if first:
        expected = seqs[0] + 1  # an opening snapshot stands at the seq it covers
    if seqs[first:] != list(range(expected, expected + n - first)):
        return None
    types: set[type[Event]] = set(map(type, events[first:]))
    if Snapshot in types or set(map(_get_v, events)) != {1}:
        return None
    if any(t.VERSION != 1 and not t.SKIPPED for t in types):
        return None  # lines of a type now past version 1 may need upcasting
    mores = list(map(_get_more, events))
    commit = n
    for i in compress(range(n), mores):  # only lines of multi-event batches: few
        m = mores[i]
        if i + 1 < n and mores[i + 1] != m - 1:
            return None
        if i and mores[i - 1] and mores[i - 1] != m + 1:
            return None
    while commit and mores[commit - 1]:
        commit -= 1  # a torn batch at the end
    return commit


def _check_each(
    events: list[Event], expected: int, start: int, region: bytes, path: object
) -> tuple[int, bool]:
    """Check every line; raise CorruptLogError at the first bad one. Returns how many
    events form complete batches and whether an old-version line needs upcasting."""
    more = 0
    commit = 0
    slow = False
    for i, ev in enumerate(events):
        if ev.seq != expected and not (i == 0 and start == 0 and type(ev) is Snapshot):
            off = start + _line_offset(region, i)
            raise CorruptLogError(
                path, off, expected, f"sequence {ev.seq} where {expected} was expected"
            )
        if more and ev.more != more - 1:
            off = start + _line_offset(region, i)
            raise CorruptLogError(
                path, off, ev.seq, f"batch broken: 'more' is {ev.more}, not {more - 1}"
            )
        if type(ev) is Snapshot and (i or start):
            off = start + _line_offset(region, i)
            raise CorruptLogError(path, off, ev.seq, "snapshot after the first line")
        if ev.v != type(ev).VERSION and not type(ev).SKIPPED:
            slow = True
        expected = ev.seq + 1
        more = ev.more
        if not more:
            commit = i + 1
    return commit, slow


def _decode_slow(
    region: bytes,
    cursor: Cursor,
    decoder: msgspec.json.Decoder[Event],
    codec: EventCodec,
    path: object,
) -> list[Event]:
    """Line by line, with offsets: unknown types, upcasts and exact error positions."""
    events: list[Event] = []
    pos = 0
    seq = cursor.seq
    while pos < len(region):
        nl = region.index(b"\n", pos)
        line = region[pos:nl]
        offset = cursor.offset + pos
        try:
            ev = decoder.decode_lines(line + b"\n")[0]
            if ev.v != type(ev).VERSION and not type(ev).SKIPPED:
                ev = codec.decode_line(line, offset, path)
        except (msgspec.DecodeError, msgspec.ValidationError, IndexError):
            try:
                ev = codec.decode_line(line, offset, path)
            except CorruptLogError as exc:
                raise CorruptLogError(path, offset, exc.seq or seq + 1, exc.reason) from None
        events.append(ev)
        seq = ev.seq
        pos = nl + 1
    return events


def read_log_file(
    path: Path,
    codec: EventCodec,
    decoder: msgspec.json.Decoder[Event],
    limit: int | None = None,
) -> list[Event]:
    """Every event of the complete batches of a whole log file (the first `limit` bytes)."""
    try:
        fd = open_private(path, os.O_RDONLY)
        try:
            st = os.fstat(fd)
            size = st.st_size if limit is None else min(limit, st.st_size)
            buf = _pread_all(fd, size, 0)
        finally:
            os.close(fd)
    except OSError as exc:
        raise _storage_error(path, "reading the log", exc) from exc
    events, _ = parse_lines(buf, Cursor((st.st_dev, st.st_ino)), decoder, codec, path)
    return events


def find_head(fd: int, size: int, log_: FileSessionLog) -> tuple[LineHead | None, int]:
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
                snap, h = first
                head = LineHead(type="snapshot", seq=snap.seq, ts=snap.ts, h=h, base_h=snap.base_h)
            elif not line.strip():
                continue  # a blank line holds no event
            else:
                try:
                    head = log_.codec.head_decoder.decode(line)
                except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                    raise CorruptLogError(
                        log_.path, off, None, f"undecodable line: {exc}"
                    ) from None
            if head.more == 0:
                return head, cut
            cut = off  # a line of a batch that has no closing line: torn
        if at_start:
            return None, cut
        want *= 4  # a torn batch longer than what we read: look further back


def snapshot_header(fd: int) -> tuple[SnapshotHead, str] | None:
    """The header and `h` of the snapshot that opens a file, if it opens with one."""
    chunk = 4096
    while True:
        buf = os.pread(fd, chunk, 0)
        if not buf.startswith(b'{"type":"snapshot",'):
            return None
        i = buf.find(b',"states":{')
        if i >= 0:
            break
        if len(buf) < chunk:
            return None
        chunk *= 4
    try:
        head = _snapshot_head_decoder.decode(buf[:i] + b"}")
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if head.length <= HASH_SUFFIX_LEN:
        return None  # written before snapshots described themselves
    tail = os.pread(fd, 19, head.length - 18)  # 16 hex digits, '"}', newline
    if len(tail) != 19 or tail[16:] != b'"}\n':
        return None
    return head, tail[:16].decode("ascii", "replace")


_snapshot_head_decoder = msgspec.json.Decoder(SnapshotHead)


def _snapshot_part(fd: int, part: str) -> Snapshot | None:
    """The opening snapshot with only `part`'s state read, or None (read it whole)."""
    first = snapshot_header(fd)
    if first is None or part not in first[0].layout:
        return None
    head, h = first
    start, end = head.layout[part]
    raw = _pread_all(fd, end - start, start)
    return Snapshot(
        seq=head.seq,
        ts=head.ts,
        h=h,
        base_h=head.base_h,
        length=head.length,
        layout=head.layout,
        states={part: msgspec.Raw(raw)},
    )


def _still_there(fd: int, cursor: Cursor) -> bool:
    """Whether the line before the cursor still ends with the `h` the cursor recorded."""
    if cursor.offset == 0:
        return True
    tail = (cursor.h + '"}\n').encode()
    return os.pread(fd, len(tail), cursor.offset - len(tail)) == tail


def _pread_all(fd: int, n: int, offset: int) -> bytes:
    if n <= 0:
        return b""
    buf = os.pread(fd, n, offset)
    if len(buf) == n:
        return buf
    parts = [buf]
    got = len(buf)
    while got < n:
        chunk = os.pread(fd, n - got, offset + got)
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def _line_offset(region: bytes, index: int) -> int:
    """Where the `index`-th event's line starts (blank lines hold no event)."""
    pos = 0
    while True:
        nl = region.index(b"\n", pos)
        if region[pos:nl].strip():
            if not index:
                return pos
            index -= 1
        pos = nl + 1


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
        buf = _pread_all(fd, size - start, start)
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
