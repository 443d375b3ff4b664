"""The harness session map: conversation context id -> the harness's opaque session id.

This module owns:

- the map's files, one per context, `<root>/<context-id>/harness-session.json`, whose
  content is exactly the JSON an existing runtime writes, so both read each other's:

      {"type":"murmur.harness-session","session_id":"...","harness":"...","driver":"...",
       "created_ms":1767225600000,"updated_ms":1767225600000}

- the map's audit history: every put and forget is also appended, as the custom events
  `harness_session_put` / `harness_session_forgotten`, to the eventstore log of the session
  `harness-session-map` in the store `<root>/.eventstore` (a context id never starts with a
  dot, so that directory can never be a context's);
- the one-line failure report in `<workdir>/logs/bootstrap.log`;
- `new_harness_session_id()`, a UUIDv7 generator (Python 3.11 has no `uuid.uuid7`).

The JSON files are the source of truth for `get`; the history is for people and audits.
Nothing here is fatal: a map with no root lives in memory, a root that cannot be written
is reported once (per workdir, per process) and survived.
"""

from __future__ import annotations

import os
import stat
import threading
from datetime import datetime
from pathlib import Path
from typing import Final, Literal

import msgspec

from eventstore import entropy, process
from eventstore.engines.file.layout import (
    ensure_private_dir,
    fsync_dir,
    open_private,
    write_all,
)
from eventstore.errors import (
    InvalidRecordError,
    SnapshotVersionError,
    UnsafePathError,
)
from eventstore.format.depth import shallow
from eventstore.format.events import (
    Event,
    Snapshot,
)
from eventstore.logger import log as logger
from eventstore.store import SessionStore
from projections import (
    StructProjection,
    restore_state,
)

__all__ = [
    "FORGET_BY_A2A",
    "FORGET_BY_CLI",
    "HARNESS_SESSION_FILE_NAME",
    "HARNESS_SESSION_TYPE",
    "HISTORY_EVENT_TYPES",
    "HISTORY_SESSION_ID",
    "HISTORY_STORE_DIR",
    "REPORT_PREFIX",
    "HarnessBinding",
    "HarnessSessionEntry",
    "HarnessSessionForgotten",
    "HarnessSessionMap",
    "HarnessSessionPut",
    "HistoryEntry",
    "current_bindings",
    "history_in",
    "is_plain_context_id",
    "new_harness_session_id",
    "read_history",
]

HARNESS_SESSION_FILE_NAME: Final = "harness-session.json"
"""The name of a context's map entry inside its directory."""

HARNESS_SESSION_TYPE: Final = "murmur.harness-session"
"""The `type` every map entry carries; a file with any other type reads as absent."""

FORGET_BY_CLI: Final = "cli"
"""`forget(..., by=FORGET_BY_CLI)`: a person asked, from the command line."""

FORGET_BY_A2A: Final = "a2a"
"""`forget(..., by=FORGET_BY_A2A)`: a peer agent asked, over the agent-to-agent protocol."""

HISTORY_STORE_DIR: Final = ".eventstore"
"""The eventstore root of the map's history, inside the map's root."""

HISTORY_SESSION_ID: Final = "harness-session-map"
"""The session (in `HISTORY_STORE_DIR`) whose log is the map's history."""

REPORT_PREFIX: Final = "[harness-session]"
"""How the one failure line in `<workdir>/logs/bootstrap.log` starts."""


MAX_CONTEXT_ID_BYTES: Final = 255  # NAME_MAX on every filesystem we care about
_MAX_ENTRY_BYTES = 1 << 20  # a map entry is ~200 bytes; anything huge is not one of ours
_DIR_MODE = 0o700


# -- the file ------------------------------------------------------------------------


class HarnessSessionEntry(msgspec.Struct, kw_only=True, frozen=True):
    """One context's map entry, field for field the file's JSON (and in its key order).

    Decoding ignores unknown keys and any key order, so the other runtime may add fields.
    """

    type: str = HARNESS_SESSION_TYPE
    session_id: str
    harness: str = ""
    driver: str = ""
    created_ms: int = 0
    updated_ms: int = 0


class _FileEntry(msgspec.Struct, kw_only=True):
    # what a file must hold to be an entry: unlike HarnessSessionEntry, `type` is required
    type: str
    session_id: str
    harness: str = ""
    driver: str = ""
    created_ms: int = 0
    updated_ms: int = 0


_entry_encoder = msgspec.json.Encoder()
_entry_decoder = msgspec.json.Decoder(_FileEntry)


def _decode_entry(data: bytes) -> HarnessSessionEntry | None:
    """The entry in `data`, or None when it is not a usable map entry (never raises)."""
    try:
        try:
            e = _entry_decoder.decode(data)
        except RecursionError:  # a field nested deeper than msgspec skips or reads
            e = _entry_decoder.decode(shallow(data))  # (the entry's fields are scalars)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if e.type != HARNESS_SESSION_TYPE or not e.session_id:
        return None
    return HarnessSessionEntry(
        session_id=e.session_id,
        harness=e.harness,
        driver=e.driver,
        created_ms=e.created_ms,
        updated_ms=e.updated_ms,
    )


def is_plain_context_id(context_id: object) -> bool:
    """True if `context_id` can be one directory name under the root, as it is.

    Not plain (so memory only): not a str, empty, starting with a dot (which covers `.`
    and `..` and keeps `.eventstore` free), containing `/`, `\\` or NUL, not encodable
    as UTF-8, or over 255 bytes of it.
    """
    if not isinstance(context_id, str) or not context_id or context_id[0] == ".":
        return False
    if "/" in context_id or "\\" in context_id or "\x00" in context_id:
        return False
    try:
        return len(context_id.encode("utf-8")) <= MAX_CONTEXT_ID_BYTES
    except UnicodeEncodeError:  # a lone surrogate: no file name can carry it faithfully
        return False


def now_ms() -> int:
    """The clock the map stamps `created_ms` / `updated_ms` with and new session ids
    start from, in Unix milliseconds. A test hook: replace it to control time."""
    return entropy.time_ns() // 1_000_000


# -- session ids ---------------------------------------------------------------------

_RAND_BITS = 74  # rand_a (12) + rand_b (62)


class _Uuid7Sequence:
    """The process's last UUIDv7 (milliseconds, random bits): each new one is greater."""

    __slots__ = ("__weakref__", "last_ms", "last_rand", "lock")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.last_ms = 0
        self.last_rand = 0

    def reset_after_fork(self) -> None:
        # a forked child must not continue the parent's sequence (both would draw the
        # same next value if the random increment happened to match)
        self.lock = threading.Lock()
        self.last_ms = 0
        self.last_rand = 0

    def next(self) -> tuple[int, int]:
        with self.lock:
            ms = now_ms()
            if ms > self.last_ms:
                self.last_ms = ms
                # top bit clear: leaves half the space for increments in this millisecond
                self.last_rand = entropy.random_bits(_RAND_BITS - 1)
            else:
                self.last_rand += entropy.random_bits(32) + 1
                if self.last_rand >> _RAND_BITS:
                    self.last_ms += 1
                    self.last_rand = entropy.random_bits(_RAND_BITS - 1)
            return self.last_ms, self.last_rand


_uuid7 = _Uuid7Sequence()
process.track(_uuid7)


def new_harness_session_id() -> str:
    """A new UUID version 7 as 36 lowercase hyphenated characters.

    Time-ordered (48-bit Unix milliseconds first) and strictly increasing within this
    process, even for many calls in one millisecond or when the clock steps back: the
    74 random bits are a monotonic counter (RFC 9562, method 2) advanced by a random
    step, carrying into the timestamp if they overflow.
    """
    ms, rand = _uuid7.next()
    rand_a = rand >> 62
    rand_b = rand & ((1 << 62) - 1)
    value = (ms & ((1 << 48) - 1)) << 80 | 0x7 << 76 | rand_a << 64 | 0b10 << 62 | rand_b
    h = f"{value:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


# -- the history (eventstore events and a projection over them) -----------------------


class HarnessSessionPut(Event, tag="harness_session_put", kw_only=True):
    """History event: `context_id` was bound to `session_id` (the log stamps `ts`)."""

    context_id: str
    session_id: str
    harness: str
    driver: str
    created_ms: int
    updated_ms: int


class HarnessSessionForgotten(Event, tag="harness_session_forgotten", kw_only=True):
    """History event: `by` asked to forget `context_id`; `session_id` is what was dropped
    (None when nothing was bound)."""

    context_id: str
    session_id: str | None = None
    harness: str | None = None
    driver: str | None = None
    by: str


HISTORY_EVENT_TYPES: Final[tuple[type[Event], ...]] = (HarnessSessionPut, HarnessSessionForgotten)


class HistoryEntry(msgspec.Struct, kw_only=True, frozen=True):
    """One put or forget of the map, as `read_history` returns it."""

    seq: int
    at: datetime
    action: Literal["put", "forget"]
    context_id: str
    session_id: str | None
    harness: str | None
    driver: str | None
    by: str | None = None


class _HistoryProjection(StructProjection[list[HistoryEntry]]):
    """Folds the history session's log into its list of `HistoryEntry` (pure)."""

    name = "harness_session_history"
    version = 1
    event_types: frozenset[str] | None = frozenset(
        {"harness_session_put", "harness_session_forgotten"}
    )
    state_type = list[HistoryEntry]

    def initial(self) -> list[HistoryEntry]:
        return []

    def apply(self, state: list[HistoryEntry], event: Event) -> list[HistoryEntry]:
        if type(event) is HarnessSessionPut:
            state.append(
                HistoryEntry(
                    seq=event.seq,
                    at=event.ts,
                    action="put",
                    context_id=event.context_id,
                    session_id=event.session_id,
                    harness=event.harness,
                    driver=event.driver,
                )
            )
        elif type(event) is HarnessSessionForgotten:
            state.append(
                HistoryEntry(
                    seq=event.seq,
                    at=event.ts,
                    action="forget",
                    context_id=event.context_id,
                    session_id=event.session_id,
                    harness=event.harness,
                    driver=event.driver,
                    by=event.by,
                )
            )
        return state

    def copy(self, state: list[HistoryEntry]) -> list[HistoryEntry]:
        return list(state)  # entries are frozen: sharing them is safe


_HISTORY = _HistoryProjection()


def _open_history(root: Path) -> SessionStore:
    # fsync: a record must be as durable as the map file it records (which is fsynced)
    return SessionStore(
        root / HISTORY_STORE_DIR,
        durability="fsync",
        event_types=HISTORY_EVENT_TYPES,
        projections=[_HISTORY],
    )


def read_history(root: str | os.PathLike[str]) -> list[HistoryEntry]:
    """Every put and forget recorded under `root`, oldest first.

    `[]` when the map never wrote history there. FileNotFoundError / NotADirectoryError
    if `root` is not a directory; CorruptLogError if the history log was tampered with.
    """
    root = Path(root)
    _require_dir(root)
    if not (root / HISTORY_STORE_DIR / "sessions").is_dir():
        return []  # do not let SessionStore create anything for a read
    with _open_history(root) as store:
        try:
            entries: list[HistoryEntry] = store.load(HISTORY_SESSION_ID, _HISTORY.name)
        except SnapshotVersionError:
            # compacted without an archive by a store that did not know this projection
            # (e.g. a plain `eventstore compact`): the snapshot kept our events verbatim
            # in `unknown`, so fold them from there
            return history_in(store)
        return entries


def history_in(store: SessionStore) -> list[HistoryEntry]:
    """Every put and forget the map's history session (`HISTORY_SESSION_ID`) holds in
    `store`, oldest first; `[]` when it has none.

    For a store the history was copied to (`eventstore migrate ROOT/.eventstore URL
    --all`), on any engine; `store` learns `HISTORY_EVENT_TYPES` (`SessionStore.learn`)
    if it was not opened with them. CorruptLogError if the log was tampered with.
    """
    # a store that did not know them would read each put and forget as an unknown
    # event, passed over: a history that is there would read as none
    store.learn(HISTORY_EVENT_TYPES)
    state = _HISTORY.initial()
    for ev in store.read_events(HISTORY_SESSION_ID):
        if type(ev) is Snapshot:
            if _HISTORY.name in ev.states:
                state = restore_state(_HISTORY, ev)
                continue
            for i, raw in enumerate(ev.unknown):
                kept = store.codec.decode_line(bytes(raw), i, store.root)
                state = _HISTORY.apply(state, kept)
        else:
            state = _HISTORY.apply(state, ev)
    return state


# -- current bindings ----------------------------------------------------------------


class HarnessBinding(msgspec.Struct, kw_only=True, frozen=True):
    """One context's current entry, as `current_bindings` returns it."""

    context_id: str
    session_id: str
    harness: str
    driver: str
    created_ms: int
    updated_ms: int


def current_bindings(root: str | os.PathLike[str]) -> list[HarnessBinding]:
    """Every valid `<root>/*/harness-session.json`, sorted by context id.

    Entries that do not parse, have another type or an empty session id are skipped,
    as `get` reads them as absent; so are symlinks (to a context directory or to an
    entry) and dot directories.
    FileNotFoundError / NotADirectoryError if `root` is not a directory.
    """
    root = Path(root)
    _require_dir(root)
    out: list[HarnessBinding] = []
    with os.scandir(root) as it:
        for d in it:
            if not is_plain_context_id(d.name):
                continue
            entry = _read_entry(root, d.name)
            if entry is not None:
                out.append(
                    HarnessBinding(
                        context_id=d.name,
                        session_id=entry.session_id,
                        harness=entry.harness,
                        driver=entry.driver,
                        created_ms=entry.created_ms,
                        updated_ms=entry.updated_ms,
                    )
                )
    out.sort(key=lambda b: b.context_id)
    return out


def _require_dir(root: Path) -> None:
    st = os.stat(root)  # FileNotFoundError propagates
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(f"{root} is not a directory")


def _read_entry(root: Path, context_id: str) -> HarnessSessionEntry | None:
    """The entry of `context_id` under `root`, or None for anything else: missing, a
    context directory or entry that is a symlink, not a regular file, too large,
    unreadable, not a map entry. The context directory is opened without following a
    link and the file relative to it, so what is read is always inside the root."""
    try:
        dfd = _open_dir(root / context_id)
    except (OSError, UnsafePathError):
        return None
    try:
        # NONBLOCK: a FIFO planted as the entry must not hang the read
        fd = os.open(
            HARNESS_SESSION_FILE_NAME,
            os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC,
            dir_fd=dfd,
        )
    except OSError:
        return None
    finally:
        os.close(dfd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > _MAX_ENTRY_BYTES:
            return None
        data = os.read(fd, _MAX_ENTRY_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return _decode_entry(data)


# -- the one-line report -------------------------------------------------------------

# Bootstrap logs (real paths) this process has already reported to: one line per workdir
# per process, whichever map instance fails first and however many operations fail.
_reported: set[str] = set()
_reported_lock = threading.Lock()


def _report_once(workdir: Path, message: str) -> None:
    """Append `[harness-session] <message>` to `<workdir>/logs/bootstrap.log`, at most
    once per workdir in this process. Never raises."""
    log_path = workdir / "logs" / "bootstrap.log"
    try:
        key = os.path.realpath(log_path)
    except (OSError, ValueError):
        key = os.path.abspath(log_path)
    with _reported_lock:
        if key in _reported:
            return
        _reported.add(key)  # even if the write below fails: never retry on every put
        line = f"{REPORT_PREFIX} {message}".replace("\n", " ").replace("\r", " ") + "\n"
        try:
            _makedirs_private(log_path.parent)
            fd = open_private(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            try:
                write_all(fd, line.encode("utf-8", "backslashreplace"))
            finally:
                os.close(fd)
        except (OSError, UnsafePathError, ValueError):
            pass  # nowhere left to report to; the map keeps working in memory


def _log_once(key: str, message: str) -> None:
    """`_report_once` for a map with no workdir: one warning per root per process on the
    `eventstore` logger."""
    with _reported_lock:
        if ("log", key) in _logged:
            return
        _logged.add(("log", key))
    logger.warning("%s %s", REPORT_PREFIX, message)


_logged: set[tuple[str, str]] = set()


def _makedirs_private(path: Path) -> list[Path]:
    """Create `path` and any missing ancestors, each mode 0700 from the start (unlike
    os.makedirs, whose parents get the umask's mode). A `path` that exists must be a
    directory; like SessionStore's root, it may be a symlink the user chose. Returns
    the directories it created, outermost first."""
    missing: list[Path] = []
    p = path
    while not os.path.lexists(p):
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for d in reversed(missing):
        ensure_private_dir(d)
    if not missing:
        _require_dir(path)
    return missing[::-1]


# -- the map -------------------------------------------------------------------------


class _Unwritten(msgspec.Struct, frozen=True):
    """What this process did to a context but could not make the file say: a put whose
    write failed (`entry`), or a forget whose file could not be removed (`entry` None).
    `at_ms` is when; a file written after it (a later `updated_ms`) supersedes it."""

    entry: HarnessSessionEntry | None
    at_ms: int


class HarnessSessionMap:
    """Remembers, per conversation context, the session id its harness answers to.

    `root` is the directory of context directories (None: memory only); `workdir` is
    where `logs/bootstrap.log` gets the one `[harness-session]` line if the root cannot
    be written (None: the line goes to the `eventstore` logger instead).

    The rule across processes: the newest write wins (`put`, `forget`), and the first
    binding stays (`bind`). The file
    `<root>/<context-id>/harness-session.json` is the truth and is read on every `get`,
    so a put or forget by another process (or the other runtime) is seen at once, also
    for a context this process bound. Only what this process could not write (the file
    could not be written or removed) is kept in memory, and a file written after it
    takes over again. Never raises for a filesystem problem. Safe to share between
    threads.
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | None = None,
        workdir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.root: Path | None = None if root is None else Path(root)
        self.workdir: Path | None = None if workdir is None else Path(workdir)
        # context id -> what this process did but the disk does not show (see _Unwritten);
        # for a context with no file (no root, an id that is not plain) every put and
        # forget is kept here
        self._memory: dict[str, _Unwritten] = {}
        self._lock = threading.RLock()
        self._history: SessionStore | None = None

    # -- public API -------------------------------------------------------------------

    def entry_path(self, context_id: str) -> Path | None:
        """`<root>/<context_id>/harness-session.json`, or None with no root or when the id
        is not a plain path segment (see `is_plain_context_id`)."""
        if self.root is None or not is_plain_context_id(context_id):
            return None
        return self.root / context_id / HARNESS_SESSION_FILE_NAME

    def get(self, context_id: str) -> str | None:
        """The harness session id bound to `context_id`, or None."""
        entry = self._current(context_id)
        return None if entry is None else entry.session_id

    def put(self, context_id: str, session_id: str, harness: str, driver: str) -> None:
        """Bind `context_id` to `session_id` (an empty `session_id` is ignored).

        Writes the file atomically, keeping `created_ms` of the entry it replaces, and
        records the put in the history; any failure is reported once and survived (the
        binding is then kept in this process's memory).
        """
        self._bind(context_id, session_id, harness, driver, replace=True)

    def bind(self, context_id: str, session_id: str, harness: str, driver: str) -> str:
        """The session id `context_id` is bound to: the one already bound, or else
        `session_id`, bound now as `put` binds it. Of processes binding one context at
        once, exactly one binding is written and all of them get it (the file is created
        only where none exists). An entry that cannot be read is replaced, as by `put`."""
        bound = self._bind(context_id, session_id, harness, driver, replace=False)
        return session_id if bound is None else bound

    def _bind(
        self, context_id: str, session_id: str, harness: str, driver: str, *, replace: bool
    ) -> str | None:
        """`put` (`replace`), or `bind`: then the id already bound, if one is (None: the
        given one was bound, or is empty)."""
        for name, value in (
            ("context_id", context_id),
            ("session_id", session_id),
            ("harness", harness),
            ("driver", driver),
        ):
            if not isinstance(value, str):
                raise TypeError(f"{name} must be a str, got {type(value).__name__}")
            if name != "context_id" and not value.isascii():
                try:  # (a context id is a file name: one that is not UTF-8 stays in memory)
                    value.encode("utf-8")
                except UnicodeEncodeError:
                    raise InvalidRecordError(
                        f"{name} {value!r} is not encodable as UTF-8 (lone surrogate)"
                    ) from None
        if not session_id:
            return None
        if len(session_id) + len(harness) + len(driver) > _MAX_ENTRY_BYTES // 8:
            # (8: room for JSON escapes) an entry a reader would take for a planted file
            raise InvalidRecordError("session_id, harness and driver are too long for an entry")
        with self._lock:
            path = self.entry_path(context_id)
            now = now_ms()
            before = self._current(context_id)
            if before is not None and not replace:
                return before.session_id
            created = now if before is None or before.created_ms <= 0 else before.created_ms
            entry = HarnessSessionEntry(
                session_id=session_id,
                harness=harness,
                driver=driver,
                created_ms=created,
                updated_ms=max(now, created),
            )
            if path is None:
                self._memory[context_id] = _Unwritten(entry, now)
                return None
            assert self.root is not None
            data = _entry_encoder.encode(entry)
            try:
                if not self._write_entry(self.root, context_id, data, replace=replace):
                    # another process created it since this one looked: it won
                    won = _read_entry(self.root, context_id)
                    if won is not None:
                        return won.session_id
                    self._write_entry(self.root, context_id, data, replace=True)
                self._memory.pop(context_id, None)
            except (OSError, UnsafePathError) as exc:
                self._memory[context_id] = _Unwritten(entry, now)
                self._report(f"cannot write {path}: {_describe(exc)}")
            self._record(
                HarnessSessionPut(
                    context_id=context_id,
                    session_id=session_id,
                    harness=harness,
                    driver=driver,
                    created_ms=entry.created_ms,
                    updated_ms=entry.updated_ms,
                )
            )
            return None

    def forget(self, context_id: str, *, by: str) -> str | None:
        """Drop the binding of `context_id` and remove its file; return the session id
        dropped (None if there was none). `by` says who asked (`FORGET_BY_CLI`,
        `FORGET_BY_A2A`, or another name) and goes into the history."""
        if not isinstance(by, str):
            raise TypeError(f"by must be a str, got {type(by).__name__}")
        with self._lock:
            path = self.entry_path(context_id)
            dropped = self._current(context_id)
            if path is None:
                self._memory.pop(context_id, None)
                return None if dropped is None else dropped.session_id
            assert self.root is not None
            try:
                self._remove_entry(self.root, context_id)
                self._memory.pop(context_id, None)
            except (OSError, UnsafePathError) as exc:
                # the stale file stays: remember the forget so it cannot come back here
                self._memory[context_id] = _Unwritten(None, now_ms())
                self._report(f"cannot remove {path}: {_describe(exc)}")
            self._record(
                HarnessSessionForgotten(
                    context_id=context_id,
                    session_id=None if dropped is None else dropped.session_id,
                    harness=None if dropped is None else dropped.harness,
                    driver=None if dropped is None else dropped.driver,
                    by=by,
                )
            )
            return None if dropped is None else dropped.session_id

    def close(self) -> None:
        """Release the history store (the map keeps working; it reopens on demand)."""
        with self._lock:
            if self._history is not None:
                self._history.close()
                self._history = None

    def __enter__(self) -> HarnessSessionMap:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals --------------------------------------------------------------------

    def _current(self, context_id: str) -> HarnessSessionEntry | None:
        """The newest binding: the file, unless this process wrote something the file
        could not take (`_memory`) after the file's `updated_ms`."""
        with self._lock:
            unwritten = self._memory.get(context_id)
            path = self.entry_path(context_id)
            if path is None:
                return None if unwritten is None else unwritten.entry
            assert self.root is not None
            on_disk = _read_entry(self.root, context_id)
            if unwritten is None:
                return on_disk
            if on_disk is not None and on_disk.updated_ms > unwritten.at_ms:
                del self._memory[context_id]  # written later, by someone else: it wins
                return on_disk
            return unwritten.entry

    def _report(self, what: str) -> None:
        message = (
            f"{what}; harness sessions under {self.root} are kept in memory only"
            " (this is reported once)"
        )
        if self.workdir is not None:
            _report_once(self.workdir, message)
        else:
            _log_once(str(self.root), message)

    def _record(self, event: Event) -> None:
        """Append one history event; a failure is reported, never raised."""
        assert self.root is not None
        try:
            if self._history is None:
                _makedirs_private(self.root)  # SessionStore would make missing parents 0755
                self._history = _open_history(self.root)
            self._history.append(HISTORY_SESSION_ID, [event])
        except Exception as exc:  # history is an audit aid: nothing in it may break a put
            self._report(
                f"cannot append to the history in {self.root / HISTORY_STORE_DIR}: {_describe(exc)}"
            )

    @staticmethod
    def _write_entry(root: Path, context_id: str, data: bytes, *, replace: bool) -> bool:
        """Atomically replace the context's file with `data`: a unique temporary file in
        the same directory, fsynced, renamed over the entry, then the directory fsynced.
        Without `replace`, the temporary file is linked as the entry only where none
        exists; False when one did (nothing written). Works through a directory fd so a
        context dir swapped for a symlink is refused."""
        created = _makedirs_private(root)
        if not os.path.lexists(root / context_id):
            created.append(root / context_id)
        ensure_private_dir(root / context_id)
        dfd = _open_dir(root / context_id)
        try:
            tmp = f".{HARNESS_SESSION_FILE_NAME}.{os.getpid()}.{entropy.token_hex(8)}.tmp"
            fd = os.open(
                tmp,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
                dir_fd=dfd,
            )
            try:
                try:
                    write_all(fd, data, fsync=True)
                finally:
                    os.close(fd)
                if replace:
                    os.replace(tmp, HARNESS_SESSION_FILE_NAME, src_dir_fd=dfd, dst_dir_fd=dfd)
                else:
                    try:
                        os.link(tmp, HARNESS_SESSION_FILE_NAME, src_dir_fd=dfd, dst_dir_fd=dfd)
                    except FileExistsError:
                        return False
                    finally:
                        os.unlink(tmp, dir_fd=dfd)
            except BaseException:
                try:
                    os.unlink(tmp, dir_fd=dfd)
                except OSError:
                    pass
                raise
            try:
                os.fsync(dfd)
                for d in created:  # a new directory's own name must survive power loss too
                    fsync_dir(d.parent)
            except OSError:
                pass  # the rename is done and visible; only power-loss durability is lost
            return True
        finally:
            os.close(dfd)

    @staticmethod
    def _remove_entry(root: Path, context_id: str) -> None:
        """Remove the context's file; a missing file or context dir is not an error."""
        try:
            dfd = _open_dir(root / context_id)
        except FileNotFoundError:
            return
        except NotADirectoryError:
            if os.path.isdir(root) or not os.path.lexists(root):
                return  # the context path is some other file: there is no entry to remove
            raise  # the root itself is not a directory
        try:
            try:
                os.unlink(HARNESS_SESSION_FILE_NAME, dir_fd=dfd)
            except FileNotFoundError:
                return
            try:
                os.fsync(dfd)
            except OSError:
                pass
        finally:
            os.close(dfd)


def _open_dir(path: Path) -> int:
    """An fd of the directory `path`, refusing a symlink as its last component."""
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == 40 or (exc.errno == 20 and os.path.islink(path)):  # ELOOP/ENOTDIR
            raise UnsafePathError(f"{path} is a symlink; the map never follows links") from None
        raise


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        where = f" ({exc.filename})" if exc.filename else ""
        return f"{exc.strerror}{where}"
    return f"{type(exc).__name__}: {exc}"
