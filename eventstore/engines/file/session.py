"""What the file engine keeps per session in this process, and the writers' lock.

`SessionState` holds the descriptors the writer fast path keeps open between calls and
what this process last knew of the log; the writers' lock is an exclusive `flock` on the
session's lock file, whose first bytes are the generation every replacer of the log
bumps and the journal's hints (`write_lock_head`). The engine
(`eventstore.engines.file.engine`) takes and releases the lock; the journal's epochs are
`eventstore.engines.file.durability`'s.
"""

from __future__ import annotations

import os
import sys
import threading

from eventstore.engines.base import Head
from eventstore.engines.file import journal as file_journal
from eventstore.engines.file.groupflush import IDLE_GROUP, Group
from eventstore.engines.file.layout import SessionPaths, fd_path
from eventstore.engines.file.logfile import GEN_BYTES
from eventstore.engines.file.overlay import Overlay

__all__ = [
    "GEN_BYTES",
    "LOCK_HEAD",
    "SessionState",
    "close_quietly",
    "lock_at_path",
    "lock_exclusive",
    "unlock",
    "write_lock_head",
]


class SessionState:
    """What the engine keeps per session in this process.

    The writer fast path: the lock file's and the log's descriptors stay open between
    calls (`lock_fd`, `log_fd`; -1 when closed), so an append is flock, one `pread` of
    the lock file's generation, one look at where the lock descriptor points
    (`lock_at_path`), one `fstat` of the log, the write and the unlock. Every replacer of
    the log (snapshot install, repair, removal) bumps the generation under the lock
    *before* it replaces anything, so a writer that finds the generation it cached, on
    the file still at the lock path (a directory removed by hand bumps nothing), knows
    its descriptors still name the live files, and one that finds the size it left knows
    nobody appended since. Only code holding `lock` touches the
    descriptors, which is why eviction and close never close one a writer is using.

    Under `durability="fsync"` also the journal's (`journal_fd`), the epoch its mirror
    is in as this process last found it (`epoch`), and the lock file's hints as the
    last lock found them (`head`: its first bytes; see `eventstore.engines.file.journal`),
    and the batches of this process's writers waiting for a shared flush (`group`:
    `eventstore.engines.file.groupflush`).
    """

    __slots__ = (
        "epoch",
        "gen",
        "group",
        "head",
        "journal_fd",
        "known",
        "lock",
        "lock_fd",
        "lock_mark",
        "log_fd",
        "log_link",
        "overlay",
        "paths",
    )

    def __init__(self, paths: SessionPaths, durable: bool) -> None:
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
        # which file lock_fd is (`lock_at_path`): where the kernel said it was when
        # opened (`fd_path`; durable writers), or its (device, inode)
        self.lock_mark: str | tuple[int, int] = ""
        self.head = b""  # the lock file's first bytes, as the last lock read them
        self.epoch: file_journal.Epoch | None = None
        # where the kernel says log_fd's file is (the fsync fast path: `FileEngine._append_locked`)
        self.log_link: str | None = None
        # what a power loss took from the log and its journal kept, until a writer
        # copies it back (`eventstore.engines.file.overlay`; readers read it laid over)
        self.overlay: Overlay | None = None
        # durable appends of this process's threads sharing one flush (group commit);
        # an engine that flushes nothing shares one that never holds anything: a
        # long-running process keeps a record per session, and a group is most of one
        self.group = Group() if durable else IDLE_GROUP

    def drop_log_fd(self) -> None:
        """Close the cached log descriptor (the log was replaced, or is being)."""
        fd, self.log_fd = self.log_fd, -1
        self.known = None
        self.epoch = None  # an epoch mirrors one log
        self.log_link = None
        if fd >= 0:
            close_quietly(fd)

    def drop_fds(self) -> None:
        """Close every cached descriptor (caller holds `lock`, or is a forked child)."""
        self.drop_log_fd()
        fds = (self.lock_fd, self.journal_fd)
        self.lock_fd = self.journal_fd = -1
        self.lock_mark = ""
        for fd in fds:
            if fd >= 0:
                close_quietly(fd)

    def __del__(self) -> None:
        # an engine (a store) dropped without close() must not leak its descriptors:
        # its sessions go with it (nothing else refers to them), and theirs close here
        self.drop_fds()


def lock_at_path(sess: SessionState) -> bool:
    """Whether the cached lock descriptor (locked by the caller) is still the file at the
    lock path: not unlinked, its directory not renamed away. One system call: a stat of
    the path, compared with the descriptor's (device, inode); or, for durable writers,
    where the kernel says the descriptor points (asking a file's times makes its next
    write log its inode, and durable appends write the lock file's hints) where there is
    a /proc."""
    mark = sess.lock_mark
    if isinstance(mark, str):
        return fd_path(sess.lock_fd) == mark
    try:
        st = os.lstat(sess.paths.lock_str)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == mark


def close_quietly(fd: int) -> None:
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

    def lock_exclusive(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_EX)

    def unlock(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_UN)

else:  # pragma: no cover - Windows

    def lock_exclusive(fd: int) -> None:
        import portalocker

        portalocker.lock(fd, portalocker.LockFlags.EXCLUSIVE)

    def unlock(fd: int) -> None:
        import portalocker

        portalocker.unlock(fd)


# what a lock reads of the lock file: the generation and the journal's hints after it
LOCK_HEAD = file_journal.HINTS_AT + 16


def write_lock_head(sess: SessionState, gen: bytes, hints: tuple[int, int] | None) -> None:
    """Write the lock file's first bytes (writers' lock held): the generation and,
    unless None, the journal's hints (epoch, mirrored end). Raises OSError."""
    head = gen + file_journal.pack_hints(*hints) if hints is not None else gen
    if os.pwrite(sess.lock_fd, head, 0) != len(head):
        raise OSError(f"{sess.paths.lock}: short write of its generation and hints")
    sess.gen, sess.head = gen, head
