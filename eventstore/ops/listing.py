"""The session list: pages of `SessionInfo` in a chosen order, filtered, and the index
they come from.

Owns what `SessionStore.sessions`, `set_labels` and `rebuild_index` do above the
engines: checking a page's arguments, turning the engine's `IndexEntry`s into
`SessionInfo`s and a page's last one into the cursor of the next, and, for an engine
that keeps no index (`IndexingEngine`), the same page computed by reading every
session (a scan: what `list_sessions()` callers did by hand). A rebuild reads every
session the same way and gives the entries to the engine (`replace_index`).

Paging is by keyset: a page starts strictly after the previous page's last entry in
the page's order (its time and id), never at an offset, so writes between pages never
shift one. What a walk through every page guarantees, on every engine:

- order="id" or "created" (keys that never change): every session that exists from
  the first page to the last appears exactly once; one created meanwhile appears at
  most once (it may fall before the cursor).
- order="updated": no session appears twice. One written to during the walk moves
  before the cursor: it appears if its page was read before the write, and otherwise
  it is newer than the walk's first page (start again to see it). Every session not
  written to during the walk appears exactly once.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from datetime import datetime
from typing import get_args

import msgspec

from eventstore import entropy
from eventstore.core.session_core import CoreOwner, SessionCore, core_of
from eventstore.core.validation import described
from eventstore.engines.base import (
    IndexEntry,
    IndexingEngine,
    IndexOrder,
    index_after,
    index_matches,
)
from eventstore.errors import EventStoreError, InvalidArgumentError, StorageError
from eventstore.format.events import EPOCH, Snapshot, from_micros, micros
from eventstore.logger import log
from eventstore.ops.history import parse_time, read_events
from eventstore.ops.tombstone import tombstone_of

__all__ = [
    "SessionInfo",
    "entry_of",
    "rebuild_index",
    "sessions",
]

ORDERS: tuple[str, ...] = get_args(IndexOrder)
MAX_LABEL_BYTES = 1024


class SessionInfo(msgspec.Struct, frozen=True):
    """One session in a `SessionStore.sessions` page.

    `created`/`updated`: when its first and last batch were appended (compaction is not
    a write to it); `last_seq`: its last sequence number; `events` and `bytes`: the
    lines and committed bytes of its live log (after compaction: the snapshot and what
    followed); `labels`: what `set_labels` last gave it; `deleted`: a tombstone (False
    until the store keeps them). `cursor`: pass it (or this object) as `after` to get
    the next page.
    """

    session_id: str
    created: datetime
    updated: datetime
    last_seq: int
    events: int
    bytes: int
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    deleted: bool = False

    @property
    def cursor(self) -> str:
        """An opaque, shell-safe string naming this entry's place in every order."""
        raw = msgspec.json.encode([micros(self.created), micros(self.updated), self.session_id])
        return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready dict (times as ISO 8601 UTC), what `--json` prints."""
        return {
            "session_id": self.session_id,
            "created": _iso(self.created),
            "updated": _iso(self.updated),
            "last_seq": self.last_seq,
            "events": self.events,
            "bytes": self.bytes,
            "labels": dict(self.labels),
            "deleted": self.deleted,
            "cursor": self.cursor,
        }


def _iso(ts: datetime) -> str:
    return ts.isoformat().replace("+00:00", "Z")


def _info(entry: IndexEntry) -> SessionInfo:
    return SessionInfo(
        entry.session_id,
        from_micros(entry.created_us),
        from_micros(entry.updated_us),
        entry.last_seq,
        entry.events,
        entry.bytes,
        dict(entry.labels),
        entry.deleted,
    )


def _cursor_entry(after: SessionInfo | str) -> IndexEntry:
    """The keys of a cursor (a `SessionInfo` or its `cursor` string) as an IndexEntry."""
    if isinstance(after, SessionInfo):
        return IndexEntry(after.session_id, micros(after.created), micros(after.updated), 0, 0, 0)
    if not isinstance(after, str):
        raise InvalidArgumentError(
            f"after must be a SessionInfo or its cursor string, not {described(after)}"
        )
    try:
        raw = base64.urlsafe_b64decode(after + "=" * (-len(after) % 4))
        created, updated, sid = msgspec.json.decode(raw, type=tuple[int, int, str])
    except (binascii.Error, ValueError, msgspec.DecodeError):
        raise InvalidArgumentError(f"not a session list cursor: {after[:80]!r}") from None
    return IndexEntry(sid, created, updated, 0, 0, 0)


def check_labels(labels: object, what: str) -> dict[str, str]:
    """A copy of a labels mapping (str keys, non-empty, to str values), else
    InvalidArgumentError naming `what`."""
    if not isinstance(labels, Mapping):
        raise InvalidArgumentError(f"{what} must be a dict of str to str, not {described(labels)}")
    out: dict[str, str] = {}
    for k, v in labels.items():
        if not isinstance(k, str) or not k or not isinstance(v, str):
            raise InvalidArgumentError(
                f"{what}: each label is a non-empty str key with a str value, not"
                f" {described(k)}: {described(v)}"
            )
        if len(k.encode("utf-8", "surrogatepass")) + len(v.encode("utf-8", "surrogatepass")) > (
            MAX_LABEL_BYTES
        ):
            raise InvalidArgumentError(f"{what}: label {k[:40]!r} is over {MAX_LABEL_BYTES} bytes")
        out[k] = v
    return out


def sessions(
    core: CoreOwner,
    prefix: str | None = None,
    *,
    after: SessionInfo | str | None = None,
    limit: int | None = None,
    order: str = "updated",
    labels: Mapping[str, str] | None = None,
    updated_since: datetime | str | None = None,
) -> list[SessionInfo]:
    """A page of the store's sessions: see `SessionStore.sessions`."""
    core = core_of(core)
    core.check_open()
    if prefix is not None and not isinstance(prefix, str):
        raise InvalidArgumentError(f"prefix must be a str, not {described(prefix)}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise InvalidArgumentError(f"limit must be an int >= 1 or None, not {described(limit)}")
    if order not in ORDERS:
        raise InvalidArgumentError(f"order must be one of {', '.join(ORDERS)}, not {order!r}")
    want = check_labels(labels, "labels") if labels is not None else {}
    since = _since(updated_since)
    cursor = _cursor_entry(after) if after is not None else None
    engine = core.engine
    entries: list[IndexEntry] | None = None
    if isinstance(engine, IndexingEngine):
        try:
            if engine.index_stale():
                rebuild_index(core)  # an update it refused, or logs older than the index
            entries = engine.index_page(
                order=order,  # type: ignore[arg-type]  # checked above
                after=cursor,
                limit=limit,
                prefix=prefix,
                updated_since_us=since,
                labels=want,
            )
        except StorageError as exc:
            # the index is a cache of the logs: one that cannot be opened or rebuilt (a
            # read-only copy of a store, a full disk) costs this page a scan, not the page
            log.warning("eventstore: %s: the session index cannot be used (%s); this page"
                        " reads every session", engine.url, exc)  # fmt: skip
    if entries is None:
        entries = page_of(scan(core, prefix), order, cursor, limit, prefix, since, want)  # type: ignore[arg-type]
    return [_info(_with_tombstone(core, e)) for e in entries]


def _with_tombstone(core: SessionCore, entry: IndexEntry) -> IndexEntry:
    """`entry` with `deleted` set when the session is a tombstone: only a one-line live
    log after seq 1 can be the erased form (`eventstore.ops.tombstone`), so only those
    are read."""
    if entry.events == 1 and entry.last_seq > 1 and tombstone_of(core, entry.session_id):
        return msgspec.structs.replace(entry, deleted=True)
    return entry


def _since(updated_since: datetime | str | None) -> int | None:
    if updated_since is None:
        return None
    if isinstance(updated_since, str):
        updated_since = parse_time(updated_since)
    if not isinstance(updated_since, datetime) or updated_since.tzinfo is None:
        raise InvalidArgumentError(
            f"updated_since must be an aware datetime or an ISO 8601 str, not"
            f" {described(updated_since)}"
        )
    return micros(updated_since)


def page_of(
    entries: list[IndexEntry],
    order: IndexOrder,
    after: IndexEntry | None,
    limit: int | None,
    prefix: str | None,
    since: int | None,
    labels: dict[str, str],
) -> list[IndexEntry]:
    """The page of `entries` (all of a store's, in any order) a page's arguments name:
    the rule every engine's `index_page` keeps, computed from a whole list."""
    picked = [
        e
        for e in entries
        if index_after(e, after, order) and index_matches(e, prefix, since, labels)
    ]
    picked.sort(key=lambda e: e.sort_key(order), reverse=order != "id")
    return picked if limit is None else picked[:limit]


def entry_of(core: SessionCore, session_id: str) -> IndexEntry | None:
    """What the logs say a session's index entry is (None: it has no committed line):
    its first and last event's times (the newest a snapshot covers when one stands in
    for them), its head and its labels. Reads the session's history: for rebuilds and
    scans, never for a page of an indexed store."""
    head = core.engine.head(session_id)
    if head.seq == 0:
        return None
    created = updated = EPOCH
    try:
        first = next(iter(read_events(core, session_id)), None)
        if first is not None:
            created = first.ts
    except EventStoreError:  # history pruned or unreadable: the live log's first line
        first = next(iter(read_events(core, session_id, from_seq=head.base_seq)), None)
        if first is not None:
            created = first.ts
    try:
        last = next(iter(read_events(core, session_id, from_seq=head.seq, to_seq=head.seq)), None)
    except EventStoreError:
        last = None
    if last is not None:
        updated = last.last_ts if type(last) is Snapshot and last.last_ts else last.ts
    labels = core.loaded(session_id, core.labels, core.labels.copy)
    return IndexEntry(
        session_id,
        micros(created),
        micros(max(updated, created)),
        head.seq,
        head.seq - head.base_seq + 1,
        head.size,
        labels,
    )


def scan(core: SessionCore, prefix: str | None = None) -> list[IndexEntry]:
    """Every session's entry from its logs (those starting with `prefix`): a read of
    every session, which an indexed store never needs for a page."""
    out: list[IndexEntry] = []
    for sid in core.engine.list_sessions():
        if prefix is not None and not sid.startswith(prefix):
            continue
        try:
            entry = entry_of(core, sid)
        except EventStoreError:
            # a log that cannot be folded is still a session (verify and repair name
            # what is wrong): listed from its head, with no times or labels
            head = core.engine.head(sid)
            entry = IndexEntry(sid, 0, 0, head.seq, head.seq - head.base_seq + 1, head.size)
        if entry is not None:
            out.append(entry)
    return out


def rebuild_index(core: CoreOwner) -> int:
    """Rebuild the engine's session index from the logs (every session read once: the
    repair for an index a crash or an older release left behind); the number of
    sessions indexed. Safe beside live writers: a session written meanwhile keeps the
    entry its write made. Nothing for an engine that keeps no index (0)."""
    core = core_of(core)
    core.check_open()
    engine = core.engine
    if not isinstance(engine, IndexingEngine):
        return 0
    started = micros(entropy.now())
    entries = scan(core)
    engine.replace_index(entries, started)
    return len(entries)
