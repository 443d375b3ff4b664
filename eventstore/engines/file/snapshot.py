"""Snapshots and the archive of the file engine: installing a snapshot, the archive's
names, the consistent picture of a session's history, and pruning.

A snapshot is installed by writing the new log to a temporary file, fsyncing it,
hard-linking the old log into `archive/<first>-<last>.jsonl.pending`, renaming the new
log over the old, and giving the archive link its final name:

1. a crash before the rename leaves the old log (plus a temporary file and a pending link
   to the live log, which the next install removes: `recovery.remove_strays`);
2. after it, the new log (and a pending link to the old log, which the next install names).

There is never a moment without a complete log. Readers notice the new file identity
(device, inode and the hash before their position) and re-read from the start. The
engine (`FileEngine.install_snapshot`) holds the writers' lock and checks the head; the
steps on the files are here (`plan_install`, `swap_in`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

import msgspec

from eventstore import entropy
from eventstore.engines.base import Head, History, PrunedSegment, Segment
from eventstore.engines.file.layout import (
    SessionPaths,
    ensure_private_dir,
    fsync_dir,
    open_private,
    pread_all,
    write_atomically,
)
from eventstore.engines.file.logfile import (
    open_existing,
    snapshot_header,
    storage_error,
)
from eventstore.errors import EventStoreError, StorageError, UnsafePathError

__all__ = [
    "ARCHIVE_NAME",
    "PENDING",
    "FileHistory",
    "InstallPlan",
    "archive_names",
    "plan_install",
    "prune_archive",
    "swap_in",
    "take_picture",
]

# compaction adds "-<hex>" when it archives the same range twice (a re-compacted snapshot)
ARCHIVE_NAME = re.compile(r"(\d{12})-(\d{12})(?:-[0-9a-f]+)?\.jsonl(\.pending)?\Z")

PENDING = ".pending"


def take_picture(
    paths: SessionPaths, view: Callable[[int], tuple[int, int, object]] | None = None
) -> FileHistory | None:
    """The history of a session as of now, or None if an install changed the archive or
    replaced the log while it was being taken. `view`: how a reader sees the live log
    open at a descriptor (the descriptor to read instead, its size, and an object to keep
    while reading: `FileEngine._view`)."""
    fds: list[int] = []
    picture: FileHistory | None = None
    try:
        names = sorted(archive_names(paths.archive))
        opened: list[tuple[str, int, os.stat_result]] = []
        for name in names:
            fd, st = open_existing(paths.archive / name)
            if fd is None or st is None:
                return None  # a pending link renamed, or a re-compaction: look again
            fds.append(fd)
            opened.append((name, fd, st))
        live_fd, live_st = open_existing(paths.log)
        if live_fd is not None:
            fds.append(live_fd)
        if sorted(archive_names(paths.archive)) != names:
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
            fd, size, keep = (live_fd, live_st.st_size, None) if view is None else view(live_fd)
            segments.append(_FileSegment(fd, str(paths.log), size, False, keep=keep))
        picture = FileHistory(segments, fds)  # it closes every descriptor opened here
        return picture
    finally:
        if picture is None:
            for fd in fds:
                os.close(fd)


class _FileSegment(Segment):
    __slots__ = ("_fd", "_keep")

    def __init__(
        self,
        fd: int,
        where: str,
        size: int,
        archived: bool,
        first_seq: int | None = None,
        last_seq: int | None = None,
        *,
        keep: object = None,
    ) -> None:
        self._fd = fd
        self._keep = keep  # what must live while `fd` is read (an overlay's copy)
        self.where = where
        self.path = Path(where)
        self.size = size
        self.archived = archived
        self.first_seq = first_seq
        self.last_seq = last_seq

    def read(self) -> bytes:
        try:
            return pread_all(self._fd, self.size, 0)
        except OSError as exc:
            raise storage_error(self.where, "reading", exc) from exc


class FileHistory(History):
    """A history whose segments read through descriptors it closes when closed."""

    def __init__(self, segments: list[Segment], fds: list[int]) -> None:
        super().__init__(segments)
        self._fds = fds

    def close(self) -> None:
        fds, self._fds = self._fds, []
        for fd in fds:
            os.close(fd)

    def __del__(self) -> None:
        self.close()


def archive_names(archive_dir: Path) -> list[str]:
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


def archive_name(archive_dir: Path, first: int, last: int) -> Path:
    name = archive_dir / f"{first:012d}-{last:012d}.jsonl"
    if os.path.lexists(name) or os.path.lexists(name.with_name(name.name + PENDING)):
        name = name.with_name(f"{name.stem}-{entropy.token_hex(4)}.jsonl")  # a re-compaction
    return name


def events_after_archived_snapshot(fd: int, end: int, archive_dir: Path) -> bytes | None:
    """The lines of the log `fd` after its opening snapshot, up to byte `end`, when the
    archive has a segment ending at that snapshot's seq (so the snapshot's events are
    held there); None when the log opens with no snapshot or its history is not kept."""
    first = snapshot_header(fd)
    if first is None:
        return None
    snap, _ = first
    if not any(
        (m := ARCHIVE_NAME.match(n)) and not m[3] and int(m[2]) == snap.seq
        for n in archive_names(archive_dir)
    ):
        return None  # compacted without an archive before: the snapshot stands in for it
    start = snap.length + 1
    return pread_all(fd, end - start, start) if end > start else b""


def archive_events(archive_dir: Path, first: int, last: int, data: bytes) -> Path | None:
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


class InstallPlan(msgspec.Struct, frozen=True):
    """What an install swaps in and archives, read from the live log under the lock:
    `tail`, the lines after what the snapshot covers (copied after it); `prefix`, what
    the snapshot replaced when a tail stays live and history is kept (archived alone, so
    history holds each line once); `since`, the events after the old log's opening
    snapshot when the archive already holds what that snapshot replaced (only they are
    archived: an archive never holds a copy of a snapshot's state); `old_base`, the seq
    of the old log's first line; `last_seq`, its last."""

    tail: bytes
    prefix: bytes
    since: bytes | None
    old_base: int
    last_seq: int


def plan_install(
    paths: SessionPaths, fd: int, head: Head, offset: int, *, keep_history: bool
) -> InstallPlan:
    """Read the plan of an install from the live log open at `fd` (writers' lock held),
    whose head is `head`; the snapshot covers its first `offset` bytes. Raises OSError."""
    tail = pread_all(fd, head.size - offset, offset)
    prefix = pread_all(fd, offset, 0) if tail and keep_history else b""
    since = events_after_archived_snapshot(fd, offset, paths.archive)
    if since is not None and keep_history:
        prefix = b""
    return InstallPlan(tail, prefix, since, head.base_seq, head.seq)


def swap_in(
    paths: SessionPaths,
    line: bytes,
    covers_seq: int,
    plan: InstallPlan,
    before_swap: Callable[[], None],
    *,
    keep_history: bool,
) -> Path | None:
    """Replace the live log by `line` + `plan.tail` atomically (writers' lock held),
    archiving what it replaced under `keep_history`; `before_swap` runs just before the
    swap (the engine bumps the lock file's generation). Returns the archive's path, if
    one was written. StorageError, the log unchanged, when the swap fails."""
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
        archived = archive_name(paths.archive, plan.old_base, plan.last_seq)
        # linked under a pending name: until the swap it is the live log, and
        # history readers must not take it for history
        pending = archived.with_name(archived.name + PENDING)
        os.link(paths.log, pending)
        fsync_dir(paths.archive)

    if plan.since is not None and keep_history:
        try:
            archived = archive_events(paths.archive, plan.old_base + 1, covers_seq, plan.since)
        except OSError as exc:
            raise StorageError(
                f"{paths.log}: archiving failed, the log is unchanged: {exc}", exc.errno
            ) from exc
        keep_history = False  # archived already: nothing to link
    try:
        before_swap()
        write_atomically(
            paths.log, line + plan.tail, before_replace=link_old_log if keep_history else None
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
    if pending is not None and archived is not None:
        archived = _name_archive(paths, pending, archived, covers_seq, plan)
    return archived


def _name_archive(
    paths: SessionPaths, pending: Path, archived: Path, covers_seq: int, plan: InstallPlan
) -> Path:
    """Give the pending link to the old log its final name, after the swap: the new log
    is in place, so a failure here only leaves the next compaction to finish it."""
    try:
        if plan.tail:
            # a crash before this leaves the whole old log under its own
            # (first..last) name: overlapping copies, which history reads once
            archived = archive_name(paths.archive, plan.old_base, covers_seq)
            write_atomically(archived, plan.prefix)
            os.unlink(pending)
        else:
            os.rename(pending, archived)
        fsync_dir(paths.archive)
    except OSError as exc:
        raise StorageError(
            f"{paths.log}: compacted, but naming the archive failed ({exc}); the next"
            " compaction finishes it",
            exc.errno,
        ) from exc
    return archived


def prune_archive(paths: SessionPaths, before_seq: int) -> list[PrunedSegment]:
    """Unlink the archive files whose last line comes before `before_seq` (pending
    links, which a compaction still names, are left), then fsync the archive directory
    (writers' lock held)."""
    found = []
    for name in archive_names(paths.archive):
        m = ARCHIVE_NAME.match(name)
        assert m is not None
        if not m[3] and int(m[2]) < before_seq:
            found.append((int(m[1]), int(m[2]), name))
    removed: list[PrunedSegment] = []
    for first, last, name in sorted(found):
        path = paths.archive / name
        try:
            size = os.lstat(path).st_size
            os.unlink(path)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise storage_error(path, "removing an archived log", exc) from exc
        removed.append(PrunedSegment(str(path), first, last, size))
    if removed:
        try:
            fsync_dir(paths.archive)
        except OSError as exc:
            raise storage_error(paths.archive, "syncing the archive", exc) from exc
    return removed
