"""The file engine's journal: how `durability="fsync"` makes an append durable without
flushing a file that grows.

An append-only log grows with every append, so each `fdatasync` of it also commits the
new size to the file system's journal: about 1.6 times the cost of flushing a block
overwritten in place (`python -m bench.fsync_floor`). So a durable append writes its
batch to the log (not flushed) and the same bytes into `log.journal`, a file written
whole once (so its blocks exist and its size never changes), at the place that mirrors
the batch's place in the log, and flushes only that. Every `SIZE` bytes, or whenever
the mirror cannot take the next batch, the log itself is flushed and the mirror starts
over at the log's new end: a new *epoch*.

    log.journal:  [0, 512)        the header: the epoch, where in the log it starts,
                                  which log (device, inode), the seq and link of the
                                  line before that point, a CRC-32 of the header
                  [4096, 4096+SIZE)  the mirror: byte k is the log's byte start + k, for
                                  every byte appended in this epoch by a durable writer

Everything before an epoch's start is durable in the log (it was flushed before the
header was written, and the header before any byte of the epoch). What a power loss can
leave: a log cut short (or, on file systems that allow it, ending in zeros), the mirror
holding the batches acknowledged since. `lacking` finds them: the mirror's bytes from the
point where they stop agreeing with the log, as long as they are complete batches
chained to the line before that point (every line carries its `h`, so bytes left over
from an earlier epoch, a torn write or zeros never chain). The first use of a session in
a process (`FileEngine._session`) looks, without a lock; readers then read them laid over
the log in memory (`eventstore.engines.file.overlay`), and the next writer copies them
back under the writers' lock before it changes anything. No read misses an acknowledged
append, and no reader writes.

The lock file carries two hints after its generation, written by durable writers under
the lock and never flushed: the epoch the mirror is in and how far it mirrors the log. A
writer that finds them other than it left them (a writer in another process started an
epoch, or one with `durability="flush"` appended without mirroring) starts a new epoch.
"""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import msgspec

from eventstore.engines.file.layout import (
    NotAFileError,
    datasync,
    fsync_dir,
    open_private,
    pread_all,
    pwrite_all,
    write_all,
)
from eventstore.errors import StorageError
from eventstore.format.chain import hash_checks
from eventstore.format.depth import HEAD_DECODER

__all__ = [
    "DATA_AT",
    "HINTS_AT",
    "SIZE",
    "Epoch",
    "NotAJournalError",
    "create",
    "fits",
    "hints",
    "lacking",
    "mirror",
    "open_journal",
    "pack_hints",
    "read_epoch",
    "retire",
    "start_epoch",
    "whole",
]

DATA_AT = 4096
"""Where the mirror starts: the header has a block of its own."""
SIZE = 256 << 10
"""The mirror's length: an epoch holds this many bytes of log (about 130 appends of
2 kB), after which the log is flushed once and a new epoch starts."""

_MAGIC = b"esjrnl01"
_HEADER = struct.Struct(">8sQQQQQ16s")  # magic, epoch, start, dev, ino, seq, link
_CRC = struct.Struct(">I")
_HINTS = struct.Struct(">QQ")  # the lock file's hints: epoch, mirrored end
HINTS_AT = 8
"""Where the hints are in the lock file (after its 8-byte generation)."""
_head_decoder = HEAD_DECODER
_CHUNK = 1 << 12
_PIECE = 64 << 10  # what the first look reads at a time
_LINE_OPEN = b'{"type":"'  # how every line starts (the encoder writes the tag first)


class Epoch(msgspec.Struct, frozen=True):
    """What a journal's header says: its epoch number, the log offset its mirror
    starts at, the log it mirrors (device and inode: a writer continues an epoch only
    on that file; recovery judges by the line before `start`, whose seq and link it
    holds, so that a copy of the store recovers too)."""

    number: int
    start: int
    ident: tuple[int, int]
    seq: int
    link: str

    def encode(self) -> bytes:
        """The header's bytes (CRC included)."""
        link = self.link.encode("ascii").ljust(16, b"\0")
        body = _HEADER.pack(_MAGIC, self.number, self.start, *self.ident, self.seq, link)
        return body + _CRC.pack(zlib.crc32(body))


def read_epoch(fd: int) -> Epoch | None:
    """The epoch a journal's header holds; None when it holds none that checks (a new
    journal, a torn header: then nothing of its mirror was relied on)."""
    raw = os.pread(fd, _HEADER.size + _CRC.size, 0)
    if len(raw) != _HEADER.size + _CRC.size:
        return None
    body, (crc,) = raw[: _HEADER.size], _CRC.unpack(raw[_HEADER.size :])
    if zlib.crc32(body) != crc:
        return None
    magic, number, start, dev, ino, seq, link = _HEADER.unpack(body)
    if magic != _MAGIC:
        return None
    try:
        text = link.rstrip(b"\0").decode("ascii")
    except UnicodeDecodeError:
        return None
    return Epoch(number, start, (dev, ino), seq, text)


def hints(raw: bytes) -> tuple[int, int]:
    """The (epoch, mirrored end) hints in the lock file's first bytes `raw`; (0, -1)
    when it has none (a lock file of a store that never wrote durably)."""
    if len(raw) < HINTS_AT + _HINTS.size:
        return 0, -1
    number, end = _HINTS.unpack_from(raw, HINTS_AT)
    return number, end


def pack_hints(number: int, end: int) -> bytes:
    """The hints' bytes, to write at `HINTS_AT` of the lock file."""
    return _HINTS.pack(number, end)


class NotAJournalError(StorageError):
    """What is at the journal's path is no regular file (a FIFO, a directory...)."""


def open_journal(path: Path, flags: int = os.O_RDWR) -> int:
    """The journal at `path`, open with `flags` (O_CREAT too); NotAJournalError for
    anything but a regular file (`open_private` opens without blocking: a FIFO must not
    hang a load)."""
    try:
        return open_private(path, flags)
    except NotAFileError:
        raise NotAJournalError(f"{path}: not a regular file") from None


def whole(fd: int) -> bool:
    """Whether the journal open at `fd` has its header block and all of its mirror."""
    return os.fstat(fd).st_size >= DATA_AT + SIZE


def create(path: Path) -> int:
    """Create the journal (mode 0600) with its header block and mirror written as
    zeros, flushed, its name flushed into the directory; returns it open read-write."""
    fd = open_journal(path, os.O_RDWR | os.O_CREAT)
    try:
        if not whole(fd):
            os.lseek(fd, 0, os.SEEK_SET)
            write_all(fd, bytes(DATA_AT + SIZE), fsync=True)
        fsync_dir(path.parent)
    except BaseException:
        os.close(fd)
        raise
    return fd


def start_epoch(fd: int, epoch: Epoch) -> None:
    """Write and flush the header of a new epoch (every byte before `epoch.start` is
    already durable in the log)."""
    _write_header(fd, epoch.encode())


def retire(fd: int) -> None:
    """Clear and flush the header: the mirror holds nothing to copy back (called once
    the log it mirrors is durable, before that log is replaced)."""
    _write_header(fd, bytes(_HEADER.size + _CRC.size))


def _write_header(fd: int, data: bytes) -> None:
    """Write the journal's header and flush it (a short write of so few bytes is the
    disk's trouble: raised, not retried)."""
    if os.pwrite(fd, data, 0) != len(data):
        raise OSError("short write of the journal header")
    datasync(fd)


def fits(epoch: Epoch, start: int, n: int) -> bool:
    """Whether the mirror of `epoch` has room for `n` bytes appended at log offset `start`."""
    return epoch.start <= start and start + n - epoch.start <= SIZE


def mirror(fd: int, epoch: Epoch, data: bytes, start: int, *, flush: bool = True) -> None:
    """Write `data`, appended to the log at `start`, into the mirror and flush it
    (unless `flush` is False: a later flush of the journal covers it)."""
    pwrite_all(fd, data, DATA_AT + start - epoch.start)
    if flush:
        datasync(fd)


def lacking(journal_fd: int, log_fd: int) -> tuple[int, bytes] | None:
    """What the log open at `log_fd` lacks of the batches the journal acknowledged: the
    log offset to write from and the bytes, or None when it lacks nothing (or the
    journal mirrors no epoch of this log)."""
    epoch = read_epoch(journal_fd)
    if epoch is None:
        return None
    st = os.fstat(log_fd)
    if st.st_size < epoch.start or not _ends_with(log_fd, epoch.start, epoch.link):
        # another log's (replaced since, it was flushed whole), or one cut below the
        # epoch: judged by content, not the inode, which a copy of the store changes
        return None
    n = min(SIZE, st.st_size - epoch.start)
    if _nothing_past(journal_fd, log_fd, epoch, n):
        return None  # the usual case, found at the cost of a first look
    log_part = pread_all(log_fd, n, epoch.start)
    held = pread_all(journal_fd, SIZE, DATA_AT)
    agree = _common_prefix(held, log_part)
    line_start = held.rfind(b"\n", 0, agree) + 1  # the mirror's last whole line in agreement
    seq, link = epoch.seq, epoch.link
    if line_start:
        before = held[held.rfind(b"\n", 0, line_start - 1) + 1 : line_start - 1]
        try:
            head = _head_decoder.decode(before)
        except msgspec.MsgspecError:
            return None  # (the log's own bytes: its readers report them)
        seq, link = head.seq, head.h
    end = _chained_batches(held, line_start, seq, link)
    if end <= agree or not _crash_damage(log_part, held, agree, end):
        return None
    return epoch.start + agree, held[agree:end]


def _nothing_past(journal_fd: int, log_fd: int, epoch: Epoch, n: int) -> bool:
    """The first look: whether the epoch's `n` bytes of log agree with the mirror and
    the mirror's line after them does not chain on (bytes of an earlier epoch, zeros).
    Read in pieces through two buffers: a fresh process pays for their pages, not for
    the mirror's (a cold load of an fsync session costs this). False: look closer."""
    mine, kept = bytearray(_PIECE), bytearray(_PIECE)
    at = 0
    while at < n:
        k = min(_PIECE, n - at)
        if os.preadv(log_fd, [memoryview(mine)[:k]], epoch.start + at) != k:
            return False
        if os.preadv(journal_fd, [memoryview(kept)[:k]], DATA_AT + at) != k:
            return False
        if mine[:k] != kept[:k]:
            return False
        at += k
    link = epoch.link
    if n:
        tail = mine[:k][-19:]  # (the last piece read: a line's end is in it)
        if len(tail) != 19 or not tail.endswith(b'"}\n'):
            return False  # a partial last line: the mirror may hold all of it
        link = tail[:16].decode("ascii", "replace")
    if n == SIZE:
        return True  # the mirror holds nothing past the log
    got = os.preadv(journal_fd, [kept], DATA_AT + n)
    nxt = bytes(kept[:got])
    if not nxt.startswith(_LINE_OPEN):
        return True  # zeros, or a piece of an earlier epoch's line
    nl = nxt.find(b"\n")
    if nl < 0:
        return False  # a line longer than the look
    line = nxt[:nl]
    return not hash_checks(
        link.encode("ascii", "replace"), line, line[-18:-2].decode("ascii", "replace")
    )


def _crash_damage(log_part: bytes, held: bytes, at: int, end: int) -> bool:
    """Whether where the log differs from the mirror in [`at`, `end`) is what a power
    loss leaves: bytes missing (the log cut short), runs of zeros (a file system that
    kept a later write but not an earlier one), a partial last line, or lines garbled
    as a power loss garbles them (`_garbled`). A line that differs otherwise (an edit
    inside it, its newline alone replaced) is corruption, for the log's readers to
    report: never overwritten."""
    whole = min(end, log_part.rfind(b"\n") + 1)  # the log's complete lines end here
    while at < whole:
        differing = log_part[at:whole]
        zeros = len(differing) - len(differing.lstrip(b"\0"))
        if zeros == 0:
            if not _garbled(log_part, held, at):
                return False
            zeros = held.find(b"\n", at) + 1 - at  # the rest of the line
        at += zeros
        at += _common_prefix(held[at:whole], log_part[at:whole])
    return True


def _garbled(log_part: bytes, held: bytes, at: int) -> bool:
    """Whether the mirror's line holding `at` (where the log first differs from it) is
    garbled in the log as a power loss garbles: from the line's first byte, or through
    its end (blocks allocated and never written hold whatever the disk held: ext4
    data=writeback), and not its newline alone."""
    line_start = held.rfind(b"\n", 0, at) + 1
    line_end = held.find(b"\n", at) + 1  # (> at: `end` closes whole batches)
    mine, kept = log_part[line_start:line_end], held[line_start:line_end]
    if mine[:-1] == kept[:-1]:
        return False
    return at == line_start or mine[-1:] != b"\n"


def _ends_with(fd: int, offset: int, link: str) -> bool:
    """Whether the bytes before `offset` end a line whose `h` is `link`."""
    tail = link.encode("ascii") + b'"}\n'
    return offset >= len(tail) and pread_all(fd, len(tail), offset - len(tail)) == tail


def _chained_batches(held: bytes, at: int, seq: int, link: str) -> int:
    """Where the complete batches of lines chained to (`seq`, `link`) from `at` end."""
    end = at
    while True:
        nl = held.find(b"\n", at)
        if nl < 0:
            return end
        line = held[at:nl]
        try:
            head = _head_decoder.decode(line)
        except msgspec.MsgspecError:
            return end
        if head.type == "snapshot" or head.seq != seq + 1:
            return end
        if not hash_checks(link.encode("ascii"), line, head.h):
            return end
        seq, link, at = head.seq, head.h, nl + 1
        if head.more == 0:
            end = at  # a batch ends with its line of more == 0


def _common_prefix(a: bytes, b: bytes) -> int:
    """How many bytes `a` and `b` agree on from the start."""
    if len(a) >= len(b) and a.startswith(b):
        return len(b)  # the usual case, in one comparison
    n = min(len(a), len(b))
    lo = 0
    while lo < n and a[lo : lo + _CHUNK] == b[lo : lo + _CHUNK]:
        lo += _CHUNK
    hi = min(n, lo + _CHUNK)
    while lo < hi and a[lo] == b[lo]:
        lo += 1
    return min(lo, n)
