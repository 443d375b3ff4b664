"""What a reader of the file engine sees of a log that lacks acknowledged appends its
journal holds: the log with them laid over it, in memory. Readers never write.

After a power loss the log can lack appends that `durability="fsync"` acknowledged
through the journal (`eventstore.engines.file.journal`). Only a writer copies them back
into the log, under the writers' lock, before it changes anything (`recovery.copy_back`;
`FileEngine._settle`). Until one does, a reader reads the log as that copy-back will
leave it: the first use of a session in a process looks, without a lock (`look`), and
while what it found still applies every read goes through an anonymous in-memory copy of
the log with the journal's bytes written over it (`open_read`), never through a file of
the store. A read position into those bytes stays valid once a writer copied them back
(they land at the same offsets of the same file).

Only a power loss makes a log lack what its journal acknowledged, and no process lives
through one: a look that finds nothing holds for the life of the process, and one that
finds something holds until the log changes, which only a writer that has copied the
bytes back can do (a look that sees the log change under it, racing a live writer, finds
nothing).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from eventstore.engines.file.layout import pread_all, write_all
from eventstore.engines.file.recovery import lacking_at

__all__ = ["LogRead", "Overlay", "look", "open_read"]


def _state(st: os.stat_result) -> tuple[int, int, int, int, int]:
    """What says a log changed: its file, size and times."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class Overlay:
    """The bytes `data` the journal acknowledged, to be read at offset `at` of the log,
    found when the log's state (`_state`) was `state`; and, once a read asked for it, the
    in-memory copy of the log with them written over it."""

    __slots__ = ("at", "data", "state", "_guard", "_view")

    def __init__(self, state: tuple[int, int, int, int, int], at: int, data: bytes) -> None:
        self.state = state
        self.at = at
        self.data = data
        self._guard = threading.Lock()
        self._view: tuple[int, int] | None = None  # the copy's descriptor and size

    def view(self, log_fd: int) -> tuple[int, int]:
        """The in-memory copy (descriptor, size) of the log open at `log_fd`, the
        overlay written over it; made once, closed with the overlay."""
        with self._guard:
            if self._view is None:
                self._view = _copy_with(log_fd, self.at, self.data)
            return self._view

    def __del__(self) -> None:
        if self._view is not None:
            try:
                os.close(self._view[0])
            except OSError:
                pass


def _copy_with(log_fd: int, at: int, data: bytes) -> tuple[int, int]:
    """An anonymous file (in memory where the system has `memfd_create`, else an
    unnamed temporary file outside the store) holding the log open at `log_fd` with
    `data` written at `at`, as `recovery.copy_back` would leave it."""
    size = os.fstat(log_fd).st_size
    head = pread_all(log_fd, min(size, at), 0)
    rest = (
        pread_all(log_fd, size - at - len(data), at + len(data)) if size > at + len(data) else b""
    )
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("eventstore-log-view", os.MFD_CLOEXEC)
    else:  # pragma: no cover - systems without memfd_create
        import tempfile  # here: it imports shutil, bz2 and lzma, ~2 ms of every `import`

        with tempfile.TemporaryFile() as tmp:
            fd = os.dup(tmp.fileno())
    try:
        for piece in (head, data, rest):
            write_all(fd, piece)
    except BaseException:
        os.close(fd)
        raise
    return fd, len(head) + len(data) + len(rest)


def look(journal: Path, log_fd: int) -> Overlay | None:
    """What the log open at `log_fd` lacks of what the journal acknowledged, found
    without a lock: None when it lacks nothing, or when the log changed while it looked
    (a live writer: whatever it wrote, it had copied back first)."""
    before = _state(os.fstat(log_fd))
    found = lacking_at(journal, log_fd)
    if found is None or _state(os.fstat(log_fd)) != before:
        return None
    return Overlay(before, *found)


class LogRead:
    """A log open for a read: the descriptor to read (`fd`: the log's own, or an
    overlay's copy), the log's (device, inode), how many bytes there are to read
    (`size`), and the size of the log file itself (`seen`: what `wait` compares).
    `close` closes the log's descriptor; an overlay's copy stays with the overlay."""

    __slots__ = ("fd", "ident", "log_fd", "overlay", "seen", "size")

    def __init__(
        self,
        fd: int,
        ident: tuple[int, int],
        size: int,
        seen: int,
        log_fd: int,
        overlay: Overlay | None,
    ) -> None:
        self.fd = fd
        self.ident = ident
        self.size = size
        self.seen = seen
        self.log_fd = log_fd
        self.overlay = overlay  # (keeps the copy open while this read uses it)

    def close(self) -> None:
        os.close(self.log_fd)


def open_read(
    journal: Path, log_fd: int, overlay: Overlay | None
) -> tuple[LogRead, Overlay | None]:
    """The log open at `log_fd` as a reader sees it, given the session's overlay; and
    the overlay the session has now (None once the log lacks nothing)."""
    st = os.fstat(log_fd)
    if overlay is not None and overlay.state != _state(st):
        overlay = look(journal, log_fd)  # the log changed: copied back, or look again
    if overlay is None:
        return LogRead(log_fd, (st.st_dev, st.st_ino), st.st_size, st.st_size, log_fd, None), None
    fd, size = overlay.view(log_fd)
    ident = (overlay.state[0], overlay.state[1])
    return LogRead(fd, ident, size, overlay.state[2], log_fd, overlay), overlay
