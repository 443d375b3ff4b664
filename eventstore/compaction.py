"""Compaction: rewrite a session's log as one snapshot, atomically, beside live writers.

The protocol, all under the session's writers' lock:

1. recover the tail (the writer does) and read every committed event;
2. fold every registered projection; apply retention if asked (opt-in only);
3. write `snapshot` (seq N = the last event, `base_h` = the link of line N) to a
   temporary file in the session directory; fsync it;
4. hard-link the old log into `archive/<first>-<last>.jsonl.pending`; fsync the archive;
5. rename the temporary file over the log; fsync the session directory;
6. rename the archive link to `archive/<first>-<last>.jsonl`; fsync the archive.

A crash before step 5 leaves the old log (plus a temporary file and a pending link to
the live log, which the next compaction removes); after it, the new one (and a pending
link to the old log, which the next compaction names). There is never a moment
without a complete log. Readers notice the new file identity and re-read.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from projections import Projection, fold, snapshot_entry

from .errors import CorruptLogError, EventStoreError, SnapshotVersionError, StorageError
from .events import Event, Snapshot, UnknownEvent
from .layout import ensure_private_dir, fsync_dir, open_private, write_all
from .log import Cursor, read_log_file
from .records import BootstrapState

if TYPE_CHECKING:
    from .store import SessionStore, _Session

__all__ = [
    "CompactionReport",
    "Retention",
    "archive_files",
    "compact",
    "fold_events",
    "fold_from_archive",
]

_TMP_PREFIX = "log.jsonl.compact-"
_PENDING = ".pending"


@dataclass(frozen=True, slots=True)
class Retention:
    """Opt-in trimming applied to the snapshot: keep only the newest N of each list.

    None keeps everything (the default). What is dropped stays in the archive (when
    compaction archives), so `state_at` can still see it.
    """

    progress: int | None = None
    checkpoints: int | None = None
    messages: int | None = None

    def __post_init__(self) -> None:
        for name in ("progress", "checkpoints", "messages"):
            n = getattr(self, name)
            if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 0):
                raise ValueError(f"Retention.{name} must be None or an int >= 0, got {n!r}")


@dataclass(frozen=True, slots=True)
class CompactionReport:
    """What one compaction did. `compacted` is False when the log was already compact."""

    session_id: str
    events_before: int
    events_after: int
    bytes_before: int
    bytes_after: int
    first_seq: int
    last_seq: int
    archive_path: Path | None
    seconds: float
    compacted: bool = True
    unknown_kept: int = 0
    notes: list[str] = field(default_factory=list)


def archive_files(archive_dir: Path) -> list[Path]:
    """The archived logs of a session, oldest first (names sort by sequence)."""
    try:
        names = sorted(n for n in os.listdir(archive_dir) if n.endswith(".jsonl"))
    except FileNotFoundError:
        return []
    return [archive_dir / n for n in names]


def compact(
    store: SessionStore,
    session_id: str,
    *,
    archive: bool = True,
    retention: Retention | None = None,
) -> CompactionReport:
    """Replace the session's log by one snapshot event; see the module docstring."""
    t0 = time.perf_counter()
    sess = store._session(session_id)
    log = sess.log
    paths = sess.paths
    with sess.lock, log.writer() as w:
        try:
            _remove_strays(sess, w.head)
        except OSError as exc:
            raise StorageError(f"{paths.dir}: cleaning up after a crash failed: {exc}") from exc
        size = w.head.offset
        if w.head.seq == 0:
            return CompactionReport(
                session_id, 0, 0, 0, 0, 0, 0, None, time.perf_counter() - t0, False
            )
        events = read_log_file(log.path, log.codec, log.codec.decoder(None), limit=size)
        first_seq = events[0].seq
        last = events[-1]
        if len(events) == 1 and type(last) is Snapshot and retention is None:
            return CompactionReport(
                session_id, 1, 1, size, size, first_seq, last.seq, None,
                time.perf_counter() - t0, False,
            )  # fmt: skip
        states: dict[str, msgspec.Raw] = {}
        for name, proj in store._projections.items():
            state = fold_events(store, sess, proj, proj.initial(), events)
            if retention is not None:
                state = _retain(name, state, retention)
            states[name] = snapshot_entry(proj, state)
        unknown: list[msgspec.Raw] = []
        for ev in events:
            if type(ev) is Snapshot:
                unknown.extend(ev.unknown)
            elif type(ev) is UnknownEvent:
                unknown.append(msgspec.Raw(ev.raw))
        known = sorted(t for t in log.codec.types if t != "snapshot")
        snap = Snapshot(base_h=w.head.link, states=states, unknown=unknown, known=known)
        data, _ = log.codec.encode_snapshot(snap, last.seq, w.head.link, datetime.now(UTC))
        tmp = paths.dir / f"{_TMP_PREFIX}{uuid.uuid4().hex}.tmp"
        archived = pending = None
        try:
            fd = open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            try:
                write_all(fd, data, fsync=True)
            finally:
                os.close(fd)
            if archive:
                # the old log becomes history: under durability="flush" its last appends
                # may still be only in the OS cache, and the archive must hold them all
                if log.durability != "fsync":
                    _sync_file(log.path)
                ensure_private_dir(paths.archive)
                # the archive's own name must be durable before the swap relies on it:
                # otherwise a power loss can keep the new log and lose `archive/`
                fsync_dir(paths.dir)
                archived = _archive_name(paths.archive, first_seq, last.seq)
                # linked under a pending name: until the swap it is the live log, and
                # audit tools must not take it for history
                pending = archived.with_name(archived.name + _PENDING)
                os.link(log.path, pending)
                fsync_dir(paths.archive)
            os.replace(tmp, log.path)
        except BaseException as exc:
            for leftover in (tmp, pending):
                if leftover is not None:
                    try:
                        os.unlink(leftover)
                    except OSError:
                        pass
            if isinstance(exc, OSError) and not isinstance(exc, EventStoreError):
                raise StorageError(
                    f"{log.path}: compaction failed, the log is unchanged: {exc}", exc.errno
                ) from exc
            raise
        sess.folds.clear()  # the new file has a new identity: every fold restarts from it
        try:  # the new log is in place; these steps only make it and the archive durable
            fsync_dir(paths.dir)
            if pending is not None and archived is not None:
                os.rename(pending, archived)
                fsync_dir(paths.archive)
        except OSError as exc:
            raise StorageError(
                f"{log.path}: compacted, but making it durable failed ({exc}); the next"
                " compaction finishes the archive",
                exc.errno,
            ) from exc
    return CompactionReport(
        session_id=session_id,
        events_before=len(events),
        events_after=1,
        bytes_before=size,
        bytes_after=len(data),
        first_seq=first_seq,
        last_seq=last.seq,
        archive_path=archived,
        seconds=time.perf_counter() - t0,
        unknown_kept=len(unknown),
    )


def _sync_file(path: Path) -> None:
    fd = open_private(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _archive_name(archive_dir: Path, first: int, last: int) -> Path:
    name = archive_dir / f"{first:012d}-{last:012d}.jsonl"
    if os.path.lexists(name) or os.path.lexists(name.with_name(name.name + _PENDING)):
        name = name.with_name(f"{name.stem}-{uuid.uuid4().hex[:8]}.jsonl")  # a re-compaction
    return name


def _remove_strays(sess: _Session, head: Cursor) -> None:
    """Finish or undo what a compaction that crashed left behind: temporary files go; a
    pending archive link that is still the live log goes (it would grow with it); one
    that is the old log (the swap happened) gets its final name."""
    for name in os.listdir(sess.paths.dir):
        if name.startswith(_TMP_PREFIX):
            os.unlink(sess.paths.dir / name)
    try:
        names = os.listdir(sess.paths.archive)
    except FileNotFoundError:
        return
    for name in names:
        if not name.endswith(_PENDING):
            continue
        path = sess.paths.archive / name
        st = os.lstat(path)
        if (st.st_dev, st.st_ino) == head.ident:
            os.unlink(path)
        else:
            os.rename(path, path.with_name(name[: -len(_PENDING)]))


def fold_events(
    store: SessionStore, sess: _Session, proj: Projection[Any], state: Any, events: list[Event]
) -> Any:
    """`fold`, plus what only the face can do: rebuild from the archive a state that the
    opening snapshot lacks, and name the file of a snapshot state that does not decode."""
    try:
        return fold(proj, state, events)
    except SnapshotVersionError:
        return fold_from_archive(store, sess, proj, events)
    except CorruptLogError as exc:
        if exc.path is not None:
            raise
        raise CorruptLogError(
            sess.paths.log, 0, exc.seq, exc.reason
        ) from None  # offset 0: it opens the file


def fold_from_archive(
    store: SessionStore, sess: _Session, proj: Projection[Any], events: list[Event]
) -> Any:
    """Fold `proj` over the whole history (archive files, then `events`, which start with
    a snapshot that lacks this projection's state or holds another version of it)."""
    snap = events[0]
    assert isinstance(snap, Snapshot)
    wanted = proj.event_types
    if snap.known and wanted is not None and not (wanted & set(snap.known)):
        # every event this projection reads was unknown to the compactor: all kept verbatim
        kept = [store.codec.decode_line(bytes(raw), 0, sess.paths.log) for raw in snap.unknown]
        return fold(proj, proj.initial(), [*kept, *events[1:]])
    history: list[Event] = []
    upto = snap.seq
    for path in archive_files(sess.paths.archive):
        for ev in read_log_file(path, store.codec, store.codec.decoder(proj.event_types)):
            if ev.seq > upto:
                break
            if not history and ev.seq != 1:
                break  # this archive does not start at the beginning: history is lost
            if history and ev.seq <= history[-1].seq:
                continue  # a later archive starts with a snapshot of what we have
            history.append(ev)
    if not history or history[-1].seq != upto or history[0].seq != 1:
        raise SnapshotVersionError(
            f"{sess.paths.log}: the snapshot at seq {snap.seq} has no usable state for"
            f" projection {proj.name!r} (version {proj.version}) and the archive does not"
            " hold the history to rebuild it; compact with archive=True to keep it"
        )
    return fold(proj, proj.initial(), [*history, *events[1:]])


def _retain(name: str, state: Any, retention: Retention) -> Any:
    """Trim the built-in states' lists per the retention policy; others are untouched."""
    if name == "bootstrap" and isinstance(state, BootstrapState):
        if retention.progress is not None:
            state.recent_progress = _last(state.recent_progress, retention.progress)
        if retention.checkpoints is not None:
            state.checkpoints = _last(state.checkpoints, retention.checkpoints)
    elif name == "transcript" and retention.messages is not None:
        state = _last(state, retention.messages)
    return state


def _last(items: list[Any], n: int) -> list[Any]:
    return items[len(items) - n :] if n else []
