"""The memory engine: sessions kept in this process's memory, for tests, ephemeral
sessions and notebooks.

`memory://` opens a private engine (its sessions die with it); `memory://NAME` opens the
engine shared under NAME by every store of this process that opens the same URL (its
sessions live as long as the process). Appends are atomic by construction (no torn
tails); `durability` is accepted and ignored: nothing survives the process. It keeps
no caches (folding from memory costs what reading a cache would) and offers ranged
reads and pruning (`RangedEngine`, `PruningEngine`).

The named stores are module state: the one exception to "no module state" besides
`eventstore.process` (they are what `memory://NAME` shares within the process), and their
reset in a forked child is registered there.
"""

from __future__ import annotations

import bisect
import itertools
import os
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import msgspec

from eventstore import entropy, process
from eventstore.engines.base import (
    EMPTY_HEAD,
    BytesSegment,
    EncodedBatch,
    Head,
    HeadMovedError,
    History,
    IndexEntry,
    IndexingEngine,
    IndexOrder,
    InstallResult,
    KeyEngine,
    LiveView,
    Position,
    PrunedSegment,
    PruningEngine,
    RangedEngine,
    ReadResult,
    RepairHold,
    Segment,
    index_appended,
    index_matches,
    index_moved,
)
from eventstore.engines.raw import raw_end
from eventstore.session_ids import validate_session_id

__all__ = ["MemoryEngine", "from_url"]

_generations = itertools.count(1)  # a log's identity: never reused within the process


class MemoryPosition(msgspec.Struct, Position, frozen=True):
    """A place in one generation of a session's live log (a new generation begins at
    every snapshot install, repair and re-creation after removal)."""

    generation: int
    offset: int
    seq: int
    link: str
    h: str
    base_seq: int

    def head(self) -> Head:
        """The head this position is just after."""
        return Head(self.seq, self.link, self.h, self, self.offset, self.base_seq)


class _Log(msgspec.Struct):
    generation: int
    data: bytearray
    head: Head
    archive: list[tuple[int, int, bytes]]  # (first seq, last seq, bytes) oldest first
    aside: list[tuple[str, bytes]]  # what repairs dropped, by name


class _Store:
    """The sessions of one engine (shared by name between engines of the process)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.logs: dict[str, _Log] = {}
        self.key_slots: dict[str, bytes] = {}
        self.index: dict[str, IndexEntry] = {}  # written with the logs, under `changed`
        # each order's keys, sorted: made on a page, dropped by any change to the index
        self.sorted: dict[str, list[tuple[int, str]]] = {}
        self.changed = threading.Condition()
        process.track(self)

    def reset_after_fork(self) -> None:
        """A fresh condition: another thread of the parent may have held its lock at the
        fork. That thread may also have been between extending a log and moving its
        head: the child takes each head from the bytes."""
        self.changed = threading.Condition()
        for lg in self.logs.values():
            lg.head = _scan_head(lg.generation, bytes(lg.data))
            del lg.data[lg.head.size :]


# the named stores (`memory://NAME`), shared by every engine of the process that opens
# the name: the one registry of module state outside `eventstore.process`
_shared: dict[str, _Store] = {}
_shared_guard = threading.Lock()


@process.at_fork
def _fresh_guard() -> None:
    global _shared_guard
    _shared_guard = threading.Lock()  # another thread of the parent may have held it


class MemoryEngine(RangedEngine, PruningEngine, KeyEngine, IndexingEngine):
    """Sessions in memory: private, or shared by `name` within the process."""

    def __init__(self, name: str | None = None) -> None:
        if name is None:
            self._store = _Store("")
            self.url = "memory://"
        else:
            with _shared_guard:
                store = _shared.get(name)
                if store is None:
                    store = _shared[name] = _Store(name)
            self._store = store
            self.url = f"memory://{name}"

    def _where(self, session_id: str) -> str:
        return f"{self.url.rstrip('/')}/{session_id}"

    def _log(self, session_id: str) -> _Log | None:
        validate_session_id(session_id)
        return self._store.logs.get(session_id)

    # -- reading ----------------------------------------------------------------------

    def read(self, session_id: str, position: Position | None) -> ReadResult:
        """The lines after `position` of the session's live log."""
        where = self._where(session_id)
        with self._store.changed:
            lg = self._log(session_id)
            if lg is None:
                return ReadResult(b"", EMPTY_HEAD, position is not None, where)
            pos = position if isinstance(position, MemoryPosition) else None
            reset = False
            if pos is None or pos.generation != lg.generation:
                reset = position is not None
                start = 0
            else:
                start = pos.offset
            data = bytes(lg.data[start : lg.head.size])
            head = lg.head
        return ReadResult(data, head, reset, where, start)

    def head(self, session_id: str) -> Head:
        """The session's head (kept, not computed)."""
        with self._store.changed:
            lg = self._log(session_id)
            return EMPTY_HEAD if lg is None else lg.head

    def prune_history(self, session_id: str, before_seq: int) -> list[PrunedSegment]:
        """Drop the kept segments whose last line comes before `before_seq`."""
        where = self._where(session_id)
        with self._store.changed:
            lg = self._log(session_id)
            if lg is None:
                return []
            gone = [seg for seg in lg.archive if seg[1] < before_seq]
            lg.archive = [seg for seg in lg.archive if seg[1] >= before_seq]
        return [
            PrunedSegment(f"{where}/archive/{first:012d}-{last:012d}", first, last, len(data))
            for first, last, data in gone
        ]

    @contextmanager
    def live_view(self, session_id: str) -> Iterator[LiveView]:
        """The committed live log, copied under the engine's lock (a memory copy: the
        log may be changed in place once the lock is released)."""
        where = self._where(session_id)
        with self._store.changed:
            lg = self._log(session_id)
            head = EMPTY_HEAD if lg is None else lg.head
            data = b"" if lg is None else bytes(lg.data[: head.size])
        yield LiveView(head, lambda a, b: data[a:b], where)

    def history(self, session_id: str) -> History:
        """The kept segments then the live log, copied under the engine's lock."""
        where = self._where(session_id)
        with self._store.changed:
            lg = self._log(session_id)
            if lg is None:
                return History([])
            segments: list[Segment] = [
                BytesSegment(data, f"{where}/archive/{first:012d}-{last:012d}", True, first, last)
                for first, last, data in lg.archive
            ]
            segments.append(BytesSegment(bytes(lg.data), where, False))
        return History(segments)

    def wait(self, session_id: str, position: Position | None, timeout: float) -> bool:
        """Block on the engine's condition until the session's head is not `position`."""
        deadline = time.monotonic() + max(0.0, timeout)
        with self._store.changed:
            while True:
                head = self.head(session_id)
                if head.position != position:
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._store.changed.wait(left)

    # -- writing ----------------------------------------------------------------------

    def append(self, session_id: str, batch: EncodedBatch, expected: Head) -> Head:
        """Append `batch` if the head is still `expected`."""
        where = self._where(session_id)
        with self._store.changed:
            lg = self._log(session_id)
            head = EMPTY_HEAD if lg is None else lg.head
            if not head.same_chain_point(expected):
                raise HeadMovedError(where, expected, head)
            if lg is None:
                lg = self._store.logs[session_id] = _Log(
                    next(_generations), bytearray(), EMPTY_HEAD, [], []
                )
            lg.data += batch.data
            base = lg.head.base_seq or batch.first_seq
            lg.head = MemoryPosition(
                lg.generation, len(lg.data), batch.last_seq, batch.link, batch.hashes[-1], base
            ).head()
            index = self._store.index
            index[session_id] = index_appended(
                index.get(session_id),
                session_id,
                batch.ts_us or entropy.time_ns() // 1000,
                batch.labels,
                lg.head,
            )
            self._store.sorted.clear()
            self._store.changed.notify_all()
            return lg.head

    def install_snapshot(
        self, session_id: str, line: bytes, covers: Head, *, keep_history: bool
    ) -> InstallResult:
        """Replace the live log by `line` plus the lines after `covers`."""
        where = self._where(session_id)
        with self._store.changed:
            lg = self._log(session_id)
            head = EMPTY_HEAD if lg is None else lg.head
            pos = covers.position
            if (
                lg is None
                or not isinstance(pos, MemoryPosition)
                or pos.generation != lg.generation
                or pos.offset > len(lg.data)
            ):
                raise HeadMovedError(where, covers, head)
            before = bytes(lg.data)
            archived = None
            if keep_history:
                # lines after `covers` stay live: the archive keeps what the snapshot replaced
                first, kept = head.base_seq, before[: pos.offset]
                nl = kept.find(b"\n")
                if kept.startswith(b'{"type":"snapshot",') and any(
                    last == first for _, last, _ in lg.archive
                ):
                    # the archive holds what the old snapshot replaced: keep only the
                    # events after it, so the archive holds each event once (as the file
                    # engine does)
                    first, kept = first + 1, kept[nl + 1 :]
                if kept:
                    lg.archive.append((first, covers.seq, kept))
                    archived = f"{where}/archive/{first:012d}-{covers.seq:012d}"
            tail = before[pos.offset :]
            lg.generation = next(_generations)
            lg.data = bytearray(line + tail)
            h = head.h if tail else line.rstrip(b"\n")[-18:-2].decode("ascii")
            lg.head = MemoryPosition(
                lg.generation, len(lg.data), head.seq, head.link, h, covers.seq
            ).head()
            self._moved(session_id, lg.head)
            self._store.changed.notify_all()
            return InstallResult(lg.head, archived, len(before), len(lg.data))

    @contextmanager
    def hold(self, session_id: str) -> Iterator[RepairHold]:
        """The engine's lock, held for a repair."""
        with self._store.changed:
            yield _MemoryRepairHold(self, session_id)
            self._store.changed.notify_all()

    # -- sessions ---------------------------------------------------------------------

    def list_sessions(self) -> list[str]:
        """Every session with a line."""
        with self._store.changed:
            return sorted(sid for sid, lg in self._store.logs.items() if lg.data or lg.archive)

    def remove_session(self, session_id: str) -> bool:
        """Forget the session (one dict removal: atomic for every reader)."""
        with self._store.changed:
            validate_session_id(session_id)
            gone = self._store.logs.pop(session_id, None)
            self._store.index.pop(session_id, None)
            self._store.sorted.clear()
            self._store.changed.notify_all()
            return gone is not None

    def load_key_slot(self, dk: str) -> bytes | None:
        """The key slot `dk` (`KeyEngine`)."""
        with self._store.changed:
            return self._store.key_slots.get(dk)

    def create_key_slot(self, dk: str, data: bytes) -> bool:
        """Keep the key slot `dk` unless one exists (`KeyEngine`)."""
        with self._store.changed:
            if dk in self._store.key_slots:
                return False
            self._store.key_slots[dk] = bytes(data)
            return True

    def replace_key_slot(self, dk: str, data: bytes, expected: bytes | None = None) -> bool:
        """Replace the key slot `dk`, if it holds `expected` when given (`KeyEngine`)."""
        with self._store.changed:
            if expected is not None and self._store.key_slots.get(dk) != expected:
                return False
            self._store.key_slots[dk] = bytes(data)
            return True

    def list_key_slots(self) -> list[str]:
        """Every key slot's id (`KeyEngine`)."""
        with self._store.changed:
            return sorted(self._store.key_slots)

    def remove_key_slot(self, dk: str, data: bytes) -> bool:
        """Remove the key slot `dk` if it holds `data` (`KeyEngine`)."""
        with self._store.changed:
            if self._store.key_slots.get(dk) != data:
                return False
            del self._store.key_slots[dk]
            return True

    def _moved(self, session_id: str, head: Head) -> None:
        """The index after the live log was replaced (lock held)."""
        old = self._store.index.get(session_id)
        if old is not None:
            self._store.index[session_id] = index_moved(old, head)

    # -- the session index --------------------------------------------------------------

    def index_page(
        self,
        *,
        order: IndexOrder,
        after: IndexEntry | None,
        limit: int | None,
        prefix: str | None = None,
        updated_since_us: int | None = None,
        labels: dict[str, str] | None = None,
    ) -> list[IndexEntry]:
        """A page of the index: the entries in `order` (a sorted list of keys, made
        again only after a write: one C sort), from the cursor on, filtered until the
        page is full (no log is read)."""
        want = labels or {}
        with self._store.changed:
            index = self._store.index
            keys = self._store.sorted.get(order)
            if keys is None:
                # ascending keys, ids negated for the descending orders' tiebreak: one
                # direction for bisect ("newest first" walks it from the end)
                keys = self._store.sorted[order] = sorted(
                    e.sort_key(order) if order != "id" else (0, e.session_id)
                    for e in index.values()
                )
            if order == "id":
                start = 0 if after is None else bisect.bisect_right(keys, (0, after.session_id))
                walk = range(start, len(keys))
            else:
                end = (
                    len(keys) if after is None else bisect.bisect_left(keys, after.sort_key(order))
                )
                walk = range(end - 1, -1, -1)
            page: list[IndexEntry] = []
            for i in walk:
                e = index[keys[i][1]]
                if index_matches(e, prefix, updated_since_us, want):
                    page.append(e)
                    if limit is not None and len(page) >= limit:
                        break
            return page

    def replace_index(self, entries: Sequence[IndexEntry], started_us: int) -> None:
        """Merge a rebuild's entries (see `IndexingEngine.replace_index`)."""
        with self._store.changed:
            index = self._store.index
            self._store.sorted.clear()
            given = {e.session_id: e for e in entries}
            for sid, old in list(index.items()):
                if sid not in given and old.updated_us < started_us:
                    del index[sid]
            for sid, e in given.items():
                kept = index.get(sid)
                if kept is None or kept.last_seq <= e.last_seq:
                    index[sid] = e

    def close(self) -> None:
        """Nothing to release: a shared engine's sessions live on for other stores."""


class _MemoryRepairHold(RepairHold):
    def __init__(self, engine: MemoryEngine, session_id: str) -> None:
        self._engine = engine
        self._sid = session_id
        self.where = engine._where(session_id)

    @property
    def data(self) -> bytes:
        lg = self._engine._log(self._sid)
        return b"" if lg is None else bytes(lg.data)

    def keep_prefix(self, n: int, reason: str) -> str | None:
        lg = self._engine._log(self._sid)
        if lg is None or n >= len(lg.data):
            return None
        return self.rewrite(bytes(lg.data[:n]), reason)

    def rewrite(self, data: bytes, reason: str) -> str:
        lg = self._engine._log(self._sid)
        if lg is None:
            raise KeyError(f"{self.where}: no live log to rewrite")
        name = f"{self.where}/log.{reason}-{len(lg.aside) + 1}"
        lg.aside.append((name, bytes(lg.data)))
        lg.generation = next(_generations)
        lg.data = type(lg.data)(data)
        lg.head = _scan_head(lg.generation, bytes(lg.data))
        self._engine._moved(self._sid, lg.head)
        return name


def _scan_head(generation: int, data: bytes) -> Head:
    """The head of raw log bytes (after a repair rewrote or cut them)."""
    found = raw_end(data)
    if found is None:
        return EMPTY_HEAD
    pos = MemoryPosition(generation, found.end, found.seq, found.link, found.h, found.first_seq)
    return pos.head()


def from_url(url: str | os.PathLike[str], **options: Any) -> MemoryEngine:
    """`memory://` (private) or `memory://NAME` (shared by NAME in this process).
    Options such as `durability` are accepted and ignored."""
    text = os.fspath(url)
    name = text[len("memory://") :].strip("/")
    return MemoryEngine(name or None)
