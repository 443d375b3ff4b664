"""Audit and replay: a session's whole history, read back, checked and followed.

A session's history is its archive files in order, then its live log:

    <session dir>/archive/<first seq, 12 digits>-<last seq, 12 digits>.jsonl
    <session dir>/log.jsonl

Every file after the first starts with a `snapshot` at sequence N whose `base_h` is the
hash of line N of the file before it; events after the snapshot continue the sequence
(some of them may also be in the archive file before: they are copies, read once).

Decisions (documented in the README, "Audit and replay"):

- `read_events` yields the original events. A snapshot is yielded only (a) where the
  events it replaced are in no file (compacted with `archive=False`): it then stands in
  for them, at its sequence number N, so folding what `read_events` yields always gives
  the current state; or (b) when `types` asks for `"snapshot"` explicitly.
- `state_at` / `transcript_at` are exact: the fold of the events 1..N, read from the
  archive where needed (retention never changes them). Where history is gone (no
  archive) and a snapshot cannot stand in, they raise `HistoryUnavailableError`.
  "As of a time" means every event up to the first one appended after that time.
- `verify` reports every problem it finds, each with file, byte offset and sequence
  number. Problems have a severity: an `"error"` (an edited, dropped, inserted or
  reordered line, an undecodable line, a broken batch in the middle, a broken archive
  chain) makes `ok` False; a `"warning"` does not: a torn tail (what a crash or a writer
  caught mid-append leaves; readers ignore it and the next writer truncates it), an
  event type this reader does not know, history compacted away without an archive.
- `head_hash` is the link the next append will chain to (the `h` of the last committed
  line, or a snapshot's `base_h`): compaction does not change it.
- `repair` is explicit, never automatic: it truncates a torn tail, or keeps the valid
  prefix of a log with a bad line and moves the whole original aside to
  `<log>.corrupt-<UTC timestamp>` (a hard link, so no byte is lost and there is never
  a moment without a log). It works on the live log only, under the writers' lock.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import msgspec

from projections import Projection, fold, restore_state

from .errors import (
    CorruptLogError,
    EventStoreError,
    HistoryUnavailableError,
    SnapshotVersionError,
    UnknownSessionError,
    UnsafePathError,
)
from .events import (
    Event,
    EventCodec,
    Snapshot,
    UnknownEvent,
    event_tag,
    line_hash,
    link_of,
    split_hash,
)
from .layout import SessionPaths, fsync_dir, open_private, validate_session_id, write_all
from .log import Cursor, FileSessionLog, parse_lines
from .records import BootstrapState, Message
from .store import SessionStore

__all__ = [
    "HistoryUnavailableError",
    "LogFile",
    "Problem",
    "RepairReport",
    "SessionStats",
    "UnknownSessionError",
    "VerifyReport",
    "event_summary",
    "event_to_json",
    "export_jsonl",
    "export_session",
    "follow",
    "history_files",
    "read_events",
    "repair",
    "state_at",
    "stats",
    "transcript_at",
    "verify",
]

# compaction adds "-<hex>" when it archives the same range twice (a re-compacted snapshot)
ARCHIVE_NAME = re.compile(r"(\d{12})-(\d{12})(?:-[0-9a-f]+)?\.jsonl(\.pending)?\Z")
INF = float("inf")


# -- the files of a session ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LogFile:
    """One file of a session's history. `first_seq`/`last_seq` come from an archive file's
    name (None for the live log)."""

    path: Path
    archived: bool
    first_seq: int | None = None
    last_seq: int | None = None


def history_files(store: SessionStore, session_id: str) -> list[LogFile]:
    """The archive files in sequence order, then the live log (if it exists)."""
    paths = SessionPaths(store.root, validate_session_id(session_id))
    # never read history through a planted link: not the sessions dir, the session
    # dir or archive/ (files are opened with O_NOFOLLOW)
    paths.check_no_links()
    files: list[LogFile] = []
    try:
        if os.path.islink(paths.archive):
            raise UnsafePathError(
                f"{paths.archive} is a symlink; eventstore never follows links in a store"
            )
        names = os.listdir(paths.archive)
    except (FileNotFoundError, NotADirectoryError):
        names = []
    keyed: list[tuple[int, int, int, str, LogFile]] = []
    try:
        st = os.lstat(paths.log)
        live = (st.st_dev, st.st_ino)
    except FileNotFoundError:
        live = (0, 0)
    for name in names:
        m = ARCHIVE_NAME.match(name)
        if m:
            path = paths.archive / name
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                if not m[3]:
                    continue
                # compaction just gave the pending link its final name
                name = name.removesuffix(".pending")
                path = paths.archive / name
                try:
                    st = os.lstat(path)
                except FileNotFoundError:
                    continue
            if m[3] and (st.st_dev, st.st_ino) == live:
                continue  # a pending link that is still the live log: not history yet
            # a pending link to another file is the old log of a compaction that stopped
            # just after its swap: history, which the next compaction names
            mtime = st.st_mtime_ns
            # same range twice: the older file (last written earlier) comes first
            keyed.append(
                (int(m[1]), int(m[2]), mtime, name, LogFile(path, True, int(m[1]), int(m[2])))
            )
    files = [k[-1] for k in sorted(keyed, key=lambda k: k[:4])]
    if os.path.lexists(paths.log):
        files.append(LogFile(paths.log, False))
    return files


def _require_session(store: SessionStore, session_id: str) -> list[LogFile]:
    files = history_files(store, session_id)
    if not files:
        raise UnknownSessionError(f"no session {session_id!r} in the store at {store.root}")
    return files


def _read_bytes(path: Path) -> bytes:
    fd = open_private(path, os.O_RDONLY)
    with os.fdopen(fd, "rb") as f:
        return f.read()


def _parse_file(
    store: SessionStore, session_id: str, path: Path, decoder: Any
) -> tuple[list[Event], list[bytes]]:
    """The committed events of one file and their raw lines (a torn tail is left out)."""
    buf = _read_bytes(path)
    # the log's own parser: its checks and error positions, for archive files too
    events, end = parse_lines(buf, Cursor(), decoder, store.codec, path)
    lines = buf[:end].split(b"\n")[:-1] if end else []
    return events, lines


def _history(
    store: SessionStore,
    session_id: str,
    decoder: Any,
    from_seq: int = 1,
    to_seq: int | None = None,
    *,
    exact: bool = False,
    all_snapshots: bool = False,
) -> Iterator[tuple[Event, bytes]]:
    """Every event of the history in [from_seq, to_seq] once, with its raw line.

    Snapshots follow the rules in the module docstring. `exact`: raise
    HistoryUnavailableError where the range needs events no file holds.
    """
    hi = INF if to_seq is None else to_seq
    nxt = 1  # the first sequence number not yet covered by what was read
    for lf in history_files(store, session_id):
        if lf.archived and lf.last_seq is not None and lf.last_seq < max(nxt, from_seq):
            continue  # wholly before what is wanted (or read already): skip unread
        try:
            events, lines = _parse_file(store, session_id, lf.path, decoder)
        except FileNotFoundError:
            if not lf.path.name.endswith(".pending"):
                raise
            # compaction gave the pending link its final name since it was listed
            final = lf.path.with_name(lf.path.name.removesuffix(".pending"))
            events, lines = _parse_file(store, session_id, final, decoder)
        for ev, line in zip(events, lines, strict=True):
            s = ev.seq
            if type(ev) is Snapshot:
                if s >= nxt and nxt <= hi and s >= from_seq:
                    # events nxt..s exist nowhere else: the snapshot stands in for them
                    if s > hi:
                        if exact:
                            raise HistoryUnavailableError(
                                f"session {session_id!r}: events {max(nxt, from_seq)}..{s}"
                                " were compacted without an archive"
                            )
                        return
                    yield ev, line
                elif all_snapshots and from_seq <= s <= hi:
                    yield ev, line
                nxt = max(nxt, s + 1)
                continue
            if s < nxt:
                continue  # a verbatim copy of an event an earlier file held
            if s > hi:
                return
            nxt = s + 1
            if s >= from_seq:
                yield ev, line


def _type_filter(store: SessionStore, types: Iterable[str | type[Event]] | None) -> tuple[Any, Any]:
    """(decoder, predicate) for a `types` filter: tags or Event classes."""
    if types is None:
        return store.codec.decoder(None), None
    tags: set[str] = set()
    classes: list[type[Event]] = []
    for t in types:
        if isinstance(t, str):
            tags.add(t)
        elif isinstance(t, type) and issubclass(t, Event):
            classes.append(t)
            if t is not UnknownEvent:
                tags.add(event_tag(t))
        else:
            raise TypeError(f"types must hold event tags or Event classes, not {t!r}")
    known = frozenset(tags & set(store.codec.types))
    want_unknown = UnknownEvent in classes

    def keep(ev: Event) -> bool:
        if type(ev) is UnknownEvent:
            return want_unknown or ev.type_name in tags
        return type(ev).__struct_config__.tag in tags or isinstance(ev, tuple(classes))

    # types outside the filter decode as bare envelopes: their payloads are never built
    return store.codec.decoder(known), keep


def read_events(
    store: SessionStore,
    session_id: str,
    *,
    from_seq: int = 1,
    to_seq: int | None = None,
    types: Iterable[str | type[Event]] | None = None,
) -> Iterator[Event]:
    """Typed events with `from_seq <= seq <= to_seq`, in order, each once.

    Reads the archive where compaction removed events from the live log. `types`: event
    tags (`"progress_appended"`, or the type name of an unknown event) or Event classes
    (`UnknownEvent` matches every unknown type). Snapshots are yielded only in place of
    history no file holds, or when `types` names them. An unknown session yields nothing.
    """
    decoder, keep = _type_filter(store, types)
    wants_snapshots = keep is not None and keep(Snapshot(base_h=""))
    for ev, _ in _history(
        store, session_id, decoder, from_seq, to_seq, all_snapshots=wants_snapshots
    ):
        if keep is None or keep(ev):
            yield ev


def _state_at(
    store: SessionStore,
    proj: Projection[Any],
    session_id: str,
    seq: int | None,
    at: datetime | None,
) -> Any:
    if (seq is None) == (at is None):
        raise ValueError("give exactly one of seq= and at=")
    if at is not None and (at.tzinfo is None or at.utcoffset() is None):
        raise ValueError("at= must be a timezone-aware datetime")
    if seq is not None and (not isinstance(seq, int) or isinstance(seq, bool) or seq < 0):
        raise ValueError(f"seq must be an int >= 0, got {seq!r}")
    if seq == 0:
        return proj.initial()
    decoder = store.codec.decoder(proj.event_types)
    history = _history(store, session_id, decoder, 1, seq, exact=True)
    last = 0

    def prefix() -> Iterator[Event]:
        nonlocal last
        for ev, _ in history:
            if at is not None and ev.ts > at:
                if type(ev) is Snapshot:
                    raise HistoryUnavailableError(
                        f"session {session_id!r}: the events before {_iso(ev.ts)} up to"
                        f" seq {ev.seq} were compacted without an archive"
                    )
                return
            last = ev.seq
            yield ev

    state = fold(proj, proj.initial(), prefix())
    if seq is not None and last < seq:
        raise HistoryUnavailableError(
            f"session {session_id!r} has no event {seq} (its last is {last})"
        )
    return state


def state_at(
    store: SessionStore,
    session_id: str,
    *,
    seq: int | None = None,
    at: datetime | None = None,
) -> BootstrapState:
    """The bootstrap state as of sequence number `seq` (0: before any event) or as of the
    aware time `at` (every event up to the first appended after it); exactly one.

    Equals the fold of the events 1..seq, read from the archive where needed.
    HistoryUnavailableError for a seq beyond the last, or history compacted away.
    """
    return _state_at(store, store.projections["bootstrap"], session_id, seq, at)  # type: ignore[no-any-return]


def transcript_at(
    store: SessionStore,
    session_id: str,
    *,
    seq: int | None = None,
    at: datetime | None = None,
) -> list[Message]:
    """The transcript as of `seq` or `at` (exactly one); see `state_at`."""
    return _state_at(store, store.projections["transcript"], session_id, seq, at)  # type: ignore[no-any-return]


def _iso(ts: datetime) -> str:
    return ts.astimezone(UTC).isoformat().replace("+00:00", "Z")


# -- verify ----------------------------------------------------------------------------

Severity = Literal["error", "warning"]


class Problem(msgspec.Struct, frozen=True):
    """One finding of `verify`: where (file, byte offset, sequence number) and what."""

    file: str
    offset: int
    seq: int | None
    kind: str
    message: str
    severity: Severity = "error"


class VerifyReport(msgspec.Struct):
    """What `verify` found. `ok` is False when any problem is an error (warnings, such as
    a torn tail or an unknown event type, leave it True)."""

    session_id: str
    ok: bool
    problems: list[Problem]
    head_hash: str
    head_seq: int
    events: int
    files: list[str]


@dataclass
class _FileScan:
    """What verify learned from one file."""

    first_seq: int | None = None
    last_seq: int | None = None
    first: Event | None = None
    hashes: dict[int, str] = field(default_factory=dict)
    links: dict[int, str] = field(default_factory=dict)  # what the next line chains to
    link: str = ""
    lines: int = 0


_head_only = msgspec.json.Decoder(dict[str, Any])


def _decode_one(codec: EventCodec, decoder: Any, line: bytes, off: int, path: Path) -> Event:
    try:
        return decoder.decode_lines(line + b"\n")[0]  # type: ignore[no-any-return]
    except (msgspec.DecodeError, msgspec.ValidationError, IndexError):
        return codec.decode_line(line, off, path)  # exact (or unknown type); may raise


def _scan_file(
    store: SessionStore, path: Path, buf: bytes, problems: list[Problem], *, first_file: bool
) -> _FileScan:
    """Check every line of one file on its own: hash, decoding, sequence, batches."""
    codec = store.codec
    decoder = codec.decoder(None)
    scan = _FileScan()
    name = str(path)

    def report(off: int, seq: int | None, kind: str, msg: str, sev: Severity = "error") -> None:
        problems.append(Problem(name, off, seq, kind, msg, sev))

    link: str | None = ""  # None: unknown (after a line with no readable hash)
    prev_seq: int | None = None
    more = 0
    batch_start = 0
    pos = 0
    while pos < len(buf):
        nl = buf.find(b"\n", pos)
        if nl < 0:
            report(
                pos,
                None if prev_seq is None else prev_seq + 1,
                "torn_tail",
                f"partial last line of {len(buf) - pos} bytes (no newline): a crash or a"
                " writer mid-append; readers ignore it, the next writer truncates it",
                "warning",
            )
            break
        line = buf[pos:nl]
        off = pos
        pos = nl + 1
        scan.lines += 1
        want = None if prev_seq is None else prev_seq + 1
        try:
            ev: Event | None = _decode_one(codec, decoder, line, off, path)
        except CorruptLogError as exc:
            ev = None
            report(off, want, "undecodable", exc.reason)
        sh = split_hash(line)
        if sh is None:
            report(off, want, "malformed", 'the line does not end with its "h" field')
            link = None
            if ev is not None:
                prev_seq, more = ev.seq, ev.more
            elif want is not None:
                prev_seq = want
            continue
        body, h = sh
        if ev is None:
            try:
                raw = _head_only.decode(line)
                seq_raw = raw.get("seq")
                prev_seq = seq_raw if isinstance(seq_raw, int) else want
                more = raw.get("more", 0) if isinstance(raw.get("more", 0), int) else 0
            except msgspec.DecodeError:
                prev_seq = want
            link = h
            continue
        seq = ev.seq
        is_snap = type(ev) is Snapshot
        if is_snap:
            if prev_seq is not None:
                report(off, seq, "misplaced_snapshot", "a snapshot after the first line")
            link = ev.base_h  # type: ignore[attr-defined]
        elif prev_seq is None and seq != 1 and first_file:
            report(off, seq, "sequence", f"the log starts at sequence {seq}, not 1")
        if link is not None:
            expect = line_hash(link, body)
            if expect != h:
                report(
                    off,
                    seq,
                    "hash_mismatch",
                    f"h is {h} but the line and the link before it hash to {expect}: the line"
                    " was edited, or a line before it was dropped, inserted or reordered",
                )
        if want is not None and seq != want:
            report(off, seq, "sequence", f"sequence {seq} where {want} was expected")
        if more and ev.more != more - 1:
            report(
                off,
                seq,
                "batch",
                f"batch broken: 'more' is {ev.more} where {more - 1} was expected",
            )
        if not ev.more:
            batch_start = pos
        if type(ev) is UnknownEvent:
            report(
                off,
                seq,
                "unknown_type",
                f"event type {ev.type_name!r} is unknown to this reader (hash checked,"
                " payload not)",
                "warning",
            )
        if scan.first is None:
            scan.first = ev
            scan.first_seq = seq
        scan.hashes[seq] = h
        prev_seq = seq
        more = ev.more
        link = link_of(ev) if type(ev) is not UnknownEvent else h
        scan.links[seq] = link
        if not more:
            scan.last_seq = seq
            scan.link = link
    if more:
        report(
            batch_start,
            scan.last_seq + 1 if scan.last_seq is not None else None,
            "torn_batch",
            "the last batch has no closing line (a crash mid-append); readers ignore it,"
            " the next writer truncates it",
            "warning",
        )
    return scan


def verify(store: SessionStore, session_id: str) -> VerifyReport:
    """Check a session's whole history: every line's hash (recomputed), decoding,
    sequence contiguity, batch integrity, and the chain across compactions (each
    snapshot's `base_h` equals the hash of its sequence number in the archive file before
    it; copies of events in two files are identical; archive names match contents).

    Reads without the lock. UnknownSessionError if the session has no files.
    """
    files = _require_session(store, session_id)
    problems: list[Problem] = []
    prev: _FileScan | None = None
    prev_file: LogFile | None = None
    head_hash, head_seq = "", 0
    for i, lf in enumerate(files):
        name = str(lf.path)
        try:
            buf = _read_bytes(lf.path)
        except OSError as exc:
            problems.append(Problem(name, 0, None, "unreadable", str(exc)))
            prev = None
            continue
        scan = _scan_file(store, lf.path, buf, problems, first_file=i == 0)
        first = scan.first
        if lf.archived and (scan.first_seq, scan.last_seq) != (lf.first_seq, lf.last_seq):
            problems.append(
                Problem(
                    name,
                    0,
                    scan.first_seq,
                    "archive_name",
                    f"the name says seq {lf.first_seq}..{lf.last_seq}, the file holds"
                    f" {scan.first_seq}..{scan.last_seq}",
                )
            )
        if isinstance(first, Snapshot):
            n = first.seq
            if prev is None:
                problems.append(
                    Problem(
                        name,
                        0,
                        n,
                        "history_gap",
                        f"events 1..{n} were compacted without an archive: the snapshot's"
                        " base_h cannot be checked",
                        "warning",
                    )
                )
            else:
                assert prev_file is not None
                old_h = prev.links.get(n)
                if old_h is None:
                    problems.append(
                        Problem(
                            name,
                            0,
                            n,
                            "archive_chain",
                            f"the snapshot covers seq {n}, which {prev_file.path.name} does"
                            f" not hold ({prev.first_seq}..{prev.last_seq})",
                        )
                    )
                elif old_h != first.base_h:
                    problems.append(
                        Problem(
                            name,
                            0,
                            n,
                            "snapshot_base",
                            f"base_h {first.base_h} is not the hash {old_h} of seq {n} in"
                            f" {prev_file.path}",
                        )
                    )
                for s, h in scan.hashes.items():
                    if s > n and prev.hashes.get(s, h) != h:
                        problems.append(
                            Problem(
                                name,
                                0,
                                s,
                                "archive_mismatch",
                                f"seq {s} differs from its copy in {prev_file.path.name}",
                            )
                        )
                # lines after a snapshot chain to base_h, not to the snapshot's own h, so
                # a snapshot edited with its h recomputed breaks no link: compare its
                # states with the fold of the archived history instead
                problems.extend(_check_snapshot_states(store, session_id, first, name))
        elif i > 0 and first is not None:
            problems.append(
                Problem(
                    name,
                    0,
                    first.seq,
                    "archive_chain",
                    "a file after an archive file does not start with a snapshot",
                )
            )
        if scan.last_seq is not None:
            head_hash, head_seq = scan.link, scan.last_seq
        prev, prev_file = scan, lf
    problems.sort(key=lambda p: (files_index(files, p.file), p.offset))
    return VerifyReport(
        session_id=session_id,
        ok=not any(p.severity == "error" for p in problems),
        problems=problems,
        head_hash=head_hash,
        head_seq=head_seq,
        events=head_seq,
        files=[str(f.path) for f in files],
    )


def _check_snapshot_states(
    store: SessionStore, session_id: str, snap: Snapshot, name: str
) -> list[Problem]:
    """Each registered projection's state in `snap` against the fold of events 1..seq.

    Opt-in retention may have trimmed the built-in lists: the snapshot's progress,
    checkpoints and messages must then be a suffix of the folded ones.
    """
    try:
        history = [
            ev
            for ev, _ in _history(
                store, session_id, store.codec.decoder(None), 1, snap.seq, exact=True
            )
        ]
    except EventStoreError:
        return []  # the archive itself is damaged: reported on its own lines
    if not history or history[-1].seq != snap.seq or type(history[0]) is Snapshot:
        return []  # the history before this snapshot is not all there to compare with
    found: list[Problem] = []
    for proj in store.projections.values():
        try:
            stored = restore_state(proj, snap)
        except SnapshotVersionError as exc:
            found.append(Problem(name, 0, snap.seq, "snapshot_version", str(exc), "warning"))
            continue
        expected = fold(proj, proj.initial(), history)
        if proj.encode_state(stored) == proj.encode_state(expected):
            continue
        if _retained(stored, expected):
            continue
        found.append(
            Problem(
                name,
                0,
                snap.seq,
                "snapshot_state",
                f"the snapshot's {proj.name!r} state differs from the fold of the archived"
                f" events 1..{snap.seq}: the snapshot was edited",
            )
        )
    return found


def _retained(stored: Any, expected: Any) -> bool:
    """True if `stored` is `expected` with lists trimmed by retention (newest kept)."""

    def suffix(a: list[Any], b: list[Any]) -> bool:
        return len(a) <= len(b) and (not a or a == b[len(b) - len(a) :])

    if isinstance(stored, BootstrapState) and isinstance(expected, BootstrapState):
        return (
            stored.manifest == expected.manifest
            and stored.feature_list == expected.feature_list
            and suffix(stored.recent_progress, expected.recent_progress)
            and suffix(stored.checkpoints, expected.checkpoints)
        )
    if isinstance(stored, list) and isinstance(expected, list):
        return suffix(stored, expected)
    return False


def files_index(files: list[LogFile], name: str) -> int:
    """Position of a file (by path string) in `files`; for sorting problems."""
    for i, f in enumerate(files):
        if str(f.path) == name:
            return i
    return len(files)


# -- follow ----------------------------------------------------------------------------


def follow(
    store: SessionStore,
    session_id: str,
    *,
    from_seq: int = 1,
    poll_interval: float = 0.2,
    stop: threading.Event | None = None,
) -> Iterator[Event]:
    """Yield every event with seq >= `from_seq` as it is appended, by any process, until
    `stop` is set (or the generator is closed). Each event once, none missed.

    Polls the live log from a cursor. When the log is replaced (compaction), events
    appended after the last poll and before the compaction are read from the archive;
    with no archive, the snapshot stands in for them (as in `read_events`).
    """
    validate_session_id(session_id)
    flog = FileSessionLog(SessionPaths(store.root, session_id), store.codec, store.durability)
    decoder = store.codec.decoder(None)
    cursor = Cursor()
    last = from_seq - 1
    while stop is None or not stop.is_set():
        res = flog.read(cursor, decoder)
        cursor = res.cursor
        for ev in res.events:
            if type(ev) is Snapshot:
                if ev.seq > last:
                    # events up to the snapshot that this reader has not seen yet
                    for old in _catch_up(store, session_id, decoder, last + 1, ev.seq):
                        if old.seq > last:
                            yield old
                            last = old.seq
                    last = max(last, ev.seq)
                continue
            if ev.seq > last:
                yield ev
                last = ev.seq
        if stop is not None:
            stop.wait(poll_interval)
        else:
            time.sleep(poll_interval)


def _catch_up(store: SessionStore, session_id: str, decoder: Any, lo: int, hi: int) -> list[Event]:
    """Events lo..hi that a compaction moved to the archive while a follower looked away.

    Compaction renames the old log's archive link from `<name>.jsonl.pending` to its
    final name just after swapping the log in: while a pending link exists, the events
    may be a moment from being readable, so wait for it (up to about a second) rather
    than yield the snapshot in their place.
    """
    archive = SessionPaths(store.root, session_id).archive
    got: list[Event] = []
    for _ in range(100):
        got = [ev for ev, _ in _history(store, session_id, decoder, lo, hi)]
        if not any(type(ev) is Snapshot for ev in got):
            return got
        try:
            pending = any(n.endswith(".jsonl.pending") for n in os.listdir(archive))
        except OSError:
            pending = False
        if not pending:
            break
        time.sleep(0.01)
    return got  # compacted without an archive: the snapshot stands in


# -- stats and export ------------------------------------------------------------------


class SessionStats(msgspec.Struct):
    """Counts and sizes of one session's history (archive included)."""

    session_id: str
    events: int
    by_type: dict[str, int]
    first_seq: int
    last_seq: int
    first_ts: datetime | None
    last_ts: datetime | None
    log_bytes: int
    log_events: int
    archive_files: int
    archive_bytes: int
    snapshots: int
    compacted_without_archive: int


def stats(store: SessionStore, session_id: str) -> SessionStats:
    """Events per type, first/last sequence and time, bytes of the log and the archive.

    `events` counts the events whose lines are still in some file; a snapshot standing in
    for history compacted without an archive is counted under "snapshot" and its covered
    events in `compacted_without_archive`.
    """
    files = _require_session(store, session_id)
    envelopes = store.codec.decoder(frozenset())  # payloads are never materialized
    by_type: dict[str, int] = {}
    first: Event | None = None
    last: Event | None = None
    lost = 0
    for ev, _ in _history(store, session_id, envelopes):
        if type(ev) is Snapshot:
            lost += ev.seq - (last.seq if last is not None else 0)
        tag = ev.type_name if type(ev) is UnknownEvent else type(ev).__struct_config__.tag
        by_type[str(tag)] = by_type.get(str(tag), 0) + 1
        if first is None:
            first = ev
        last = ev
    log_bytes = log_events = snapshots = 0
    archive_bytes = archive_files = 0
    for lf in files:
        size = os.stat(lf.path).st_size
        if lf.archived:
            archive_files += 1
            archive_bytes += size
        else:
            log_bytes = size
            events, _ = _parse_file(store, session_id, lf.path, envelopes)
            log_events = len(events)
            snapshots += sum(1 for e in events if type(e) is Snapshot)
    return SessionStats(
        session_id=session_id,
        events=sum(n for t, n in by_type.items() if t != "snapshot"),
        by_type=dict(sorted(by_type.items())),
        first_seq=first.seq if first else 0,
        last_seq=last.seq if last else 0,
        first_ts=first.ts if first else None,
        last_ts=last.ts if last else None,
        log_bytes=log_bytes,
        log_events=log_events,
        archive_files=archive_files,
        archive_bytes=archive_bytes,
        snapshots=snapshots,
        compacted_without_archive=lost,
    )


_json = msgspec.json.Encoder()


def event_to_json(ev: Event) -> Any:
    """An event as JSON-ready builtins (an unknown event as its original line)."""
    if type(ev) is UnknownEvent:
        return msgspec.json.decode(ev.raw)
    return msgspec.json.decode(_json.encode(ev))


def event_summary(ev: Event) -> str:
    """A one-line human summary of an event's payload."""
    d = event_to_json(ev)
    if type(ev) is UnknownEvent:
        return f"(unknown type {ev.type_name!r})"
    tag = d.get("type")
    if tag == "manifest_set":
        m = d["manifest"]
        steps = len((m.get("init_plan") or {}).get("steps", []))
        return (
            f"branch {m['active_branch']}, commit {m.get('last_known_good_commit') or '-'},"
            f" {steps} init steps: {m['current_objective']}"
        )
    if tag == "feature_list_replaced":
        fs = d["features"]
        done = sum(1 for f in fs if f["passes"])
        return f"{len(fs)} features ({done} passing): " + ", ".join(f["id"] for f in fs)
    if tag == "feature_pass_updated":
        return f"{d['feature_id']} -> {'passes' if d['passes'] else 'fails'}"
    if tag == "progress_appended":
        e = d["entry"]
        return f"[{e['run_id']}] {e['summary']}"
    if tag == "checkpoint_recorded":
        c = d["checkpoint"]
        note = f": {c['note']}" if c.get("note") else ""
        return f"[{c['run_id']}] {c['status']}{note}"
    if tag == "messages_appended":
        ms = d["messages"]
        head = f"{ms[0]['role']}: {ms[0]['content']}" if ms else ""
        return f"{len(ms)} message{'s' if len(ms) != 1 else ''}: {head}"
    if tag == "snapshot":
        return f"snapshot of seq 1..{d['seq']} (base_h {d['base_h']}; {', '.join(d['states'])})"
    payload = {
        k: v for k, v in d.items() if k not in ("type", "seq", "ts", "more", "key", "v", "h")
    }
    return _json.encode(payload).decode()


def export_session(store: SessionStore, session_id: str) -> dict[str, Any]:
    """One session as a JSON-ready document: its current bootstrap state, transcript,
    last sequence number and head hash."""
    _require_session(store, session_id)
    state = store.load_bootstrap_state(session_id)
    transcript = store.load_transcript_messages(session_id)
    return {
        "session_id": session_id,
        "last_seq": store.last_seq(session_id),
        "state": msgspec.to_builtins(state),
        "transcript": msgspec.to_builtins(transcript),
    }


def export_jsonl(store: SessionStore, session_id: str) -> Iterator[bytes]:
    """The raw lines (with newline) of the history, each event once, as `read_events`
    selects them: verbatim, so the hashes of consecutive lines still check."""
    _require_session(store, session_id)
    for _, line in _history(store, session_id, store.codec.decoder(frozenset())):
        yield line + b"\n"


# -- repair ----------------------------------------------------------------------------


class RepairReport(msgspec.Struct):
    """What `repair` did. `action`: "none" (nothing to do), "truncated" (a torn tail was
    cut off) or "moved_aside" (the log had a bad line: the original is kept at
    `moved_to`, the log keeps its valid prefix)."""

    session_id: str
    action: Literal["none", "truncated", "moved_aside"]
    log: str
    moved_to: str | None
    kept_events: int
    kept_bytes: int
    dropped_bytes: int
    problem: Problem | None
    message: str


def repair(store: SessionStore, session_id: str) -> RepairReport:
    """Make the live log trustworthy again, explicitly and under the writers' lock.

    A torn tail is truncated. A log with any error (see `verify`) keeps the committed
    batches before the first bad line; the original file is first hard-linked to
    `<log>.corrupt-<UTC timestamp>`, then the prefix is written to a temporary file,
    fsynced and renamed over the log. Archive files are never changed.
    """
    _require_session(store, session_id)
    paths = SessionPaths(store.root, session_id)
    log_path = paths.log
    if not os.path.lexists(log_path):
        raise UnknownSessionError(f"session {session_id!r} has no live log to repair")
    with FileSessionLog(paths, store.codec, store.durability).locked():
        buf = _read_bytes(log_path)
        problems: list[Problem] = []
        scan = _scan_file(store, log_path, buf, problems, first_file=True)
        errors = [p for p in problems if p.severity == "error"]
        torn = [p for p in problems if p.kind in ("torn_tail", "torn_batch")]
        if not errors and not torn:
            return RepairReport(
                session_id, "none", str(log_path), None, scan.lines, len(buf), 0, None,
                "the log is intact; nothing to do",
            )  # fmt: skip
        if not errors:
            cut = _committed_end(store, session_id, log_path, buf, len(buf))
            fd = open_private(log_path, os.O_RDWR)
            try:
                os.ftruncate(fd, cut)
                os.fsync(fd)
            finally:
                os.close(fd)
            kept = len(
                _parse_file(store, session_id, log_path, store.codec.decoder(frozenset()))[0]
            )
            return RepairReport(
                session_id, "truncated", str(log_path), None, kept, cut, len(buf) - cut, torn[0],
                f"truncated a torn tail of {len(buf) - cut} bytes at byte {cut}",
            )  # fmt: skip
        bad = errors[0]
        cut = _committed_end(store, session_id, log_path, buf, bad.offset)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
        aside = log_path.with_name(f"{log_path.name}.corrupt-{stamp}")
        os.link(log_path, aside)  # the original bytes, kept before anything changes
        fsync_dir(log_path.parent)  # durably: a power loss must not keep the rename alone
        tmp = log_path.with_name(log_path.name + ".repair-tmp")
        fd = open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            write_all(fd, buf[:cut], fsync=True)
        finally:
            os.close(fd)
        os.replace(tmp, log_path)
        fsync_dir(log_path.parent)
        kept = buf[:cut].count(b"\n")
        return RepairReport(
            session_id, "moved_aside", str(log_path), str(aside), kept, cut, len(buf) - cut, bad,
            f"{bad.kind} at byte {bad.offset} (seq {bad.seq}): kept {kept} events"
            f" ({cut} bytes) before it; the original is at {aside}",
        )  # fmt: skip


def _committed_end(store: SessionStore, session_id: str, path: Path, buf: bytes, limit: int) -> int:
    """The end of the last complete batch within buf[:limit] whose lines all check."""
    region = buf[:limit]
    region = region[: region.rfind(b"\n") + 1]
    # the parser drops a torn batch at the end of the region; what it keeps is committed
    decoder = store.codec.decoder(frozenset())
    _, end = parse_lines(region, Cursor(), decoder, store.codec, path)
    return end
