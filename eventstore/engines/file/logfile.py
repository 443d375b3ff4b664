"""Reading one log file of the file engine: read positions, where the committed lines
end, the head from the tail of the file, the header of an opening snapshot, and the small
file-identity helpers every other module of the engine uses.

Nothing here takes a lock or changes a file: these are the reads a lock-free reader and
a writer under the lock share.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from eventstore.engines.base import Head, Position
from eventstore.engines.file.layout import SessionPaths, open_private, pread_all
from eventstore.errors import EventStoreError, StorageError
from eventstore.format.chain import (
    HASH_SUFFIX_LEN,
    SNAPSHOT_OPEN,
    find_snapshot_head,
    split_hash,
)
from eventstore.format.depth import HEAD_DECODER
from eventstore.format.events import (
    LineHead,
    SnapshotHead,
)
from eventstore.format.tail import committed_end, snapshot_line_head

__all__ = [
    "GEN_BYTES",
    "HEAD_DECODER",
    "TAIL_CHUNK",
    "FilePosition",
    "first_seq_of",
    "gen_number",
    "find_head",
    "head_at",
    "ident_of",
    "in_live_log",
    "live_ident",
    "open_existing",
    "opening_h",
    "read_generation",
    "same_file",
    "snapshot_header",
    "still_there",
    "storage_error",
]

TAIL_CHUNK = 1 << 13

GEN_BYTES = 8  # the generation: a big-endian counter at the start of the lock file


def storage_error(path: object, doing: str, exc: OSError) -> Exception:
    if isinstance(exc, EventStoreError):
        return exc
    return StorageError(f"{path}: {doing} failed: {exc.strerror or exc}", exc.errno)


class FilePosition(msgspec.Struct, Position, frozen=True):
    """Where a read of one log file ended: the file (device, inode), the byte after the
    last complete batch, and that batch's last line (seq, link, `h`: the `h` proves the
    file is still the one read, even if its inode number was reused). `seen`: the size
    of the file when read (a torn tail included), which `wait` compares against; it is
    not part of the place, so positions that differ only in it are equal.

    `gen`: the lock file's generation read *before* the file was opened (a reader's), or
    the one under which a writer holding the lock wrote it; -1 when unknown. A fold
    cache records it, so that a replacement of the log that began after the read
    leaves the cache behind (`eventstore.engines.file.caches`). Not part of the place
    either: two readers of one file may have read two generations before opening it.
    """

    ident: tuple[int, int]
    offset: int
    seq: int
    link: str
    h: str
    base_seq: int
    seen: int = 0
    gen: int = -1

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


def head_at(
    ident: tuple[int, int], offset: int, line: LineHead, base_seq: int, seen: int, gen: int = -1
) -> Head:
    link = (line.base_h or "") if line.type == "snapshot" else line.h
    return FilePosition(ident, offset, line.seq, link, line.h, base_seq, seen, gen).head()


def find_head(fd: int, size: int, where: str) -> tuple[LineHead | None, int]:
    """The envelope of the last committed line and the end of the last complete batch.

    Reads only the tail of the file (and, when the last line is a compaction snapshot,
    its header at the start): bytes after the returned offset are a torn tail.
    """
    if size == 0:
        return None, 0
    first = snapshot_header(fd)
    chunk = TAIL_CHUNK
    while True:
        start = max(0, size - chunk)
        if first is not None and start < first[0].length:
            start = 0  # never read part of an opening snapshot: its header says it all
            buf = pread_all(fd, size - first[0].length, first[0].length)
            offset = first[0].length
        else:
            buf = pread_all(fd, size - start, start)
            offset = start
        # a line that may begin before the window is not read
        skip = 0 if start == 0 else buf.find(b"\n") + 1
        if start > 0 and skip == 0:
            chunk *= 4
            continue
        end, head = committed_end(buf[skip:], where, offset + skip, first, at_boundary=start == 0)
        if head is not None:
            return head, offset + skip + end
        if start == 0:
            if first is not None:
                return snapshot_line_head(first), first[0].length
            return None, 0
        chunk *= 4  # a batch longer than what we read: look further back


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


def first_seq_of(fd: int, size: int) -> int:
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
        return HEAD_DECODER.decode(line).seq
    except (msgspec.DecodeError, msgspec.ValidationError):
        return 1


def still_there(fd: int, pos: FilePosition) -> bool:
    """Whether the line before the position still ends with the `h` it recorded."""
    if pos.offset == 0:
        return True
    tail = (pos.h + '"}\n').encode()
    return os.pread(fd, len(tail), pos.offset - len(tail)) == tail


def opening_h(fd: int, size: int) -> str | None:
    """The `h` of the snapshot that opens the log open at `fd`; "" when it opens with
    another line (or is empty); None when its opening snapshot cannot be read whole.

    The one line a later line's `h` does not vouch for: the lines after a snapshot chain
    to its `base_h`, so two logs opening with other snapshots of one point (a compaction
    again with retention, a purge) can agree on every later `h` and offset."""
    if size == 0 or os.pread(fd, len(SNAPSHOT_OPEN), 0) != SNAPSHOT_OPEN:
        return ""
    first = snapshot_header(fd)
    if first is not None:
        return first[1]
    # a snapshot written before snapshots described themselves: its line, read whole
    # (and no further: the log may be long)
    n = 1 << 16
    while True:
        buf = pread_all(fd, min(n, size), 0)
        nl = buf.find(b"\n")
        if nl >= 0 or len(buf) >= size:
            break
        n *= 4
    found = split_hash(buf[:nl]) if nl >= 0 else None
    return None if found is None else found[1]


def in_live_log(
    log_path: Path, pos: FilePosition, opening: str | None = None
) -> tuple[tuple[int, int], str] | None:
    """The identity and opening `h` (`opening_h`) of the log at `log_path` if `pos` is a
    place in it: at least that long, the `h` before it, and the same first seq
    (`base_seq`, which a head carries to the face), and, unless None, the same `opening`
    `h`; else None. Not its (device, inode): a copy of the log is the same log."""
    log_fd, _ = open_existing(log_path)
    if log_fd is None:
        return None
    try:
        st = os.fstat(log_fd)
        if not (
            0 < pos.offset <= st.st_size
            and still_there(log_fd, pos)
            and first_seq_of(log_fd, st.st_size) == pos.base_seq
        ):
            return None
        found = opening_h(log_fd, st.st_size)
        if found is None or (opening is not None and found != opening):
            return None
        return (st.st_dev, st.st_ino), found
    finally:
        os.close(log_fd)


def gen_number(gen: bytes) -> int:
    """The generation as a number (a lock file shorter than 8 bytes: its bytes; none: 0)."""
    return int.from_bytes(gen[:GEN_BYTES], "big")


def read_generation(paths: SessionPaths) -> int:
    """The lock file's generation, read without the lock (a reader's, which never
    writes): 0 when there is no lock file (a session no writer has replaced reads the
    same), -1 when it cannot be read (then unknown: a FIFO, a directory or a socket
    planted there fails the open or the pread, with no fstat asked)."""
    try:
        fd = open_private(paths.lock, os.O_RDONLY)  # (a FIFO does not hang it)
    except (FileNotFoundError, NotADirectoryError):
        return 0
    except (OSError, EventStoreError):
        return -1
    try:
        return gen_number(os.pread(fd, GEN_BYTES, 0))
    except OSError:
        return -1
    finally:
        os.close(fd)


def ident_of(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return (st.st_dev, st.st_ino)


def live_ident(path: Path) -> tuple[int, int]:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return (0, 0)
    return (st.st_dev, st.st_ino)


def same_file(fd: int, path: Path) -> bool:
    """Whether the open file `fd` is still the file at `path`."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    return (st.st_dev, st.st_ino) == ident_of(fd)


def open_existing(path: Path) -> tuple[int | None, os.stat_result | None]:
    """Open a file for reading (never through a link); (None, None) if it is gone."""
    try:
        fd = open_private(path, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return None, None
    except OSError as exc:
        raise storage_error(path, "opening", exc) from exc
    return fd, os.fstat(fd)
