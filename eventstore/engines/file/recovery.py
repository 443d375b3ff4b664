"""Recovery in the file engine: what a crash, a power loss or a damaged byte leaves, and
how it is undone without destroying a committed byte.

- torn tails: the bytes after the last complete batch, set aside beside the log
  (`<log>.torn-<time>`) and cut by the next writer (`set_aside_torn`);
- acknowledged appends a power loss took from the log and its journal kept, copied back
  (`lacking`, `copy_back`; `eventstore.engines.file.journal`);
- a damaged last line (a committed line whose newline was replaced), refused rather than
  cut as if torn (`refuse_damaged_last_line`);
- what an install that crashed left: temporary files, pending archive links, archive
  copies the live log still holds (`remove_strays`, `remove_leftover_copies`);
- the repair hold, which replaces the live log only after saving the original aside
  (`FileRepairHold`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import msgspec

from eventstore import entropy
from eventstore.engines.base import RepairHold
from eventstore.engines.file import journal as file_journal
from eventstore.engines.file.caches import CACHE_PREFIX
from eventstore.engines.file.journal import NotAJournalError
from eventstore.engines.file.layout import (
    TMP_MARK,
    SessionPaths,
    datasync,
    fsync_dir,
    open_private,
    pread_all,
    pwrite_all,
    write_atomically,
)
from eventstore.engines.file.logfile import (
    HEAD_DECODER,
    FilePosition,
    open_existing,
    snapshot_header,
    storage_error,
)
from eventstore.engines.file.snapshot import ARCHIVE_NAME, PENDING, archive_names
from eventstore.errors import CorruptLogError
from eventstore.format.chain import HASH_SUFFIX_LEN, SNAPSHOT_OPEN, damaged_newline
from eventstore.logger import log

__all__ = [
    "FileRepairHold",
    "copy_back",
    "lacking",
    "lacking_at",
    "refuse_damaged_last_line",
    "remove_leftover_copies",
    "remove_strays",
    "save_aside",
    "set_aside_torn",
    "stamp",
]


_OLD_TMP_PREFIX = "log.jsonl.compact-"  # temporary files of releases before 0.2


def save_aside(log_path: Path, kind: str, data: bytes) -> Path:
    """Keep `data` beside the log as `<log>.<kind>-<UTC time>` (bytes recovery is about
    to cut or overwrite: never lost)."""
    return _fresh_aside(log_path, kind, lambda aside: write_atomically(aside, data, exclusive=True))


def _fresh_aside(log_path: Path, kind: str, put: Callable[[Path], None]) -> Path:
    """Where `put` made the aside file (creating it, `FileExistsError` if it exists):
    `<log>.<kind>-<UTC time>`, or with `-2`, `-3`... added when an earlier aside holds
    that name (the clock set back, or two in one microsecond), which is never replaced."""
    name = f"{log_path.name}.{kind}-{stamp()}"
    aside, n = log_path.with_name(name), 1
    while True:
        try:
            put(aside)
            return aside
        except FileExistsError:
            n += 1
            aside = log_path.with_name(f"{name}-{n}")


def stamp() -> str:
    return entropy.now().strftime("%Y%m%dT%H%M%S%fZ")


def lacking(paths: SessionPaths, log_flags: int) -> tuple[int, int, bytes] | None:
    """What the log lacks of what the journal acknowledged (`lacking_at`): the log open
    with `log_flags` (for the caller to close), the offset and the bytes."""
    if not os.path.lexists(paths.journal):
        return None
    try:
        lfd = open_private(paths.log, log_flags)
    except FileNotFoundError:
        return None
    try:
        found = lacking_at(paths.journal, lfd)
    except BaseException:
        os.close(lfd)
        raise
    if found is None:
        os.close(lfd)
        return None
    return lfd, found[0], found[1]


def lacking_at(journal: Path, log_fd: int) -> tuple[int, bytes] | None:
    """What the log open at `log_fd` lacks of what the journal at `journal` acknowledged
    (`file_journal.lacking`): the offset and the bytes; None when it lacks nothing, or
    there is no journal (or no regular file at its path, which is said and ignored)."""
    try:
        jfd = file_journal.open_journal(journal, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except NotAJournalError as exc:
        log.warning("eventstore: %s is not a journal, ignored: %s", journal, exc)
        return None
    try:
        return file_journal.lacking(jfd, log_fd)
    finally:
        os.close(jfd)


def refuse_damaged_last_line(buf: bytes, start: int, where: str, pos: FilePosition | None) -> None:
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
            env = HEAD_DECODER.decode(prev)
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


def remove_strays(paths: SessionPaths, live: tuple[int, int]) -> None:
    """Finish or undo what an install that crashed left behind: temporary files go; a
    pending archive link that is still the live log goes (it would grow with it); one
    that is the old log (the swap happened) gets its final name."""
    tmp_prefix = paths.log.name + TMP_MARK
    for name in os.listdir(paths.dir):
        if name.startswith((tmp_prefix, _OLD_TMP_PREFIX)):
            os.unlink(paths.dir / name)
        elif name.startswith(CACHE_PREFIX) and TMP_MARK in name:
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
    for name in archive_names(paths.archive):
        if not name.endswith(PENDING):
            continue
        path = paths.archive / name
        st = os.lstat(path)
        if (st.st_dev, st.st_ino) == live:
            os.unlink(path)
        else:
            os.rename(path, path.with_name(name[: -len(PENDING)]))


def remove_leftover_copies(archive_dir: Path, fd: int) -> None:
    """Remove archive copies an install that crashed before its swap left behind: they
    start after the live log's opening snapshot, so the live log still holds every line
    they hold (history is what the snapshot replaced, which starts at or before it)."""
    first = snapshot_header(fd)
    if first is None:
        return
    for name in archive_names(archive_dir):
        m = ARCHIVE_NAME.match(name)
        assert m is not None
        if m[3] or int(m[1]) <= first[0].seq:
            continue
        path = archive_dir / name
        fd2, _ = open_existing(path)
        if fd2 is None:
            continue
        try:
            opens_with_snapshot = os.pread(fd2, len(SNAPSHOT_OPEN), 0) == SNAPSHOT_OPEN
        finally:
            os.close(fd2)
        if not opens_with_snapshot:
            os.unlink(path)


class FileRepairHold(RepairHold):
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
            fd, _ = open_existing(self.paths.log)
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
        return None if n >= len(data) else self.rewrite(data[:n], reason)

    def rewrite(self, data: bytes, reason: str) -> str:
        log_path = self.paths.log
        try:
            # the original bytes, kept before anything changes
            aside = _fresh_aside(log_path, reason, lambda a: os.link(log_path, a))
            fsync_dir(log_path.parent)
            self._before_replace()
            write_atomically(log_path, data)
        except OSError as exc:
            raise storage_error(log_path, "repairing the log", exc) from exc
        self._data = data
        return str(aside)


def set_aside_torn(path: Path, fd: int, cut: int, size: int, *, fsync: bool) -> None:
    """Save the bytes of the log `path` (open at `fd`, writers' lock held) after the last
    complete batch (`cut`) beside it, then cut them (and fsync, under `fsync`)."""
    aside = save_aside(path, "torn", pread_all(fd, size - cut, cut))
    log.warning(
        "eventstore: %s: set aside a torn tail of %d bytes at byte %d (saved to %s)",
        path,
        size - cut,
        cut,
        aside.name,
    )
    os.ftruncate(fd, cut)
    if fsync:
        os.fsync(fd)


def copy_back(log_path: Path, fd: int, at: int, data: bytes) -> None:
    """Write `data` into the log open at `fd` from byte `at` (what it overwrites, a torn
    line or zeros, kept beside the log as a torn tail is), flush it and close `fd`
    (writers' lock held)."""
    try:
        size = os.fstat(fd).st_size
        if size > at:
            save_aside(log_path, "torn", pread_all(fd, min(size, at + len(data)) - at, at))
        pwrite_all(fd, data, at)
        datasync(fd)
    finally:
        os.close(fd)
    log.warning(
        "eventstore: %s: copied back %d bytes of acknowledged appends at byte %d from"
        " the journal (the log had lost them: a power loss)",
        log_path,
        len(data),
        at,
    )
