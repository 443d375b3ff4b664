"""Session lifecycle: deleting sessions, expiring those idle for longer than an age, and
pruning archived history that is no longer needed.

Owns the policy above `SessionStore.delete_session` (which removes one session's log,
history and caches atomically, on every engine): which sessions are old enough to go,
judged by the time of their last event, removed one by one so that a failure on one
never stops the rest; and above `PruningEngine.prune_history`: which archived segments lie
wholly before a sequence number or a time, logged as an `archive_pruned` event before
they are removed, so the audit trail says what was dropped and when. The `eventstore
delete` command and `eventstore compact --prune-archive-before` are views of it.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import PurePath

import msgspec

from eventstore.core.session_core import CoreOwner, SessionCore, core_of
from eventstore.core.validation import described, flag
from eventstore.engines.base import (
    Head,
    PrunedSegment,
    PruningEngine,
)
from eventstore.errors import (
    CorruptLogError,
    EventStoreError,
    HistoryPrunedError,
    InvalidArgumentError,
    UnsupportedError,
)
from eventstore.format.chain import hash_checks
from eventstore.format.depth import HEAD_DECODER
from eventstore.format.events import (
    ArchivePruned,
    LineHead,
    Snapshot,
)
from eventstore.ops import tombstone
from eventstore.ops.history import first_kept_seq, read_events

__all__ = [
    "ExpiryResult",
    "PruneReport",
    "delete_session",
    "delete_older_than",
    "expire_one",
    "last_activity",
    "parse_age",
    "prune_archive",
]

_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_age(text: str) -> timedelta:
    """`30d`, `12h`, `90m`, `45s`, `2w` (a number and a unit) as a timedelta;
    InvalidArgumentError (a ValueError) naming the text otherwise."""
    if not isinstance(text, str):
        raise InvalidArgumentError(f"an age is a str such as 30d, not {described(text)}")
    m = _AGE.match(text)
    if m is None:
        raise InvalidArgumentError(
            f"not an age: {text!r} (give a number and a unit: 30d, 12h, 90m, 45s, 2w)"
        )
    try:
        return timedelta(seconds=float(m.group(1)) * _UNIT[m.group(2)])
    except OverflowError:
        raise InvalidArgumentError(f"not an age: {text!r} is too long") from None


def delete_session(
    core: CoreOwner, session_id: str, *, purge: bool = False, by: str | None = None
) -> bool:
    """Delete a session, leaving a tombstone (`eventstore.ops.tombstone`), or with
    `purge` removing its log, history and caches atomically (no reader ever sees it half
    removed); safe beside live writers. False if it did not exist (or was deleted)."""
    return tombstone.delete_session(core, session_id, purge=purge, by=by)


def last_activity(core: CoreOwner, session_id: str) -> datetime | None:
    """When the session's last event was appended (None for a session with none).

    Maintenance is not activity: compaction snapshots, `archive_pruned` records and any
    other line whose `Event.is_maintenance` says so are passed over (the events a
    snapshot covers are read from the archive; a snapshot standing in for them answers
    with the time of the newest it covers, `last_ts`; one written before snapshots kept
    it, or only maintenance left, with the newest line's).
    """
    core = core_of(core)
    core.session(session_id)
    seq = core.engine.head(session_id).seq
    if seq == 0:
        return None
    first = first_kept_seq(core, session_id)  # reading below a pruned point is refused
    newest: datetime | None = None
    window = 8
    while seq >= first:
        lo = max(first, seq - window + 1)
        try:
            events = list(read_events(core, session_id, from_seq=lo, to_seq=seq))
        except HistoryPrunedError as exc:
            if exc.first_kept <= first:
                raise  # not pruned since `first` was read: no further to go
            # another process pruned the archive since `first` was read: what went was
            # never the newest activity of what is kept, so read on from there (a gc
            # reported the session as failed); with all up to `seq` gone, the newest
            # line read so far (or None: not judged idle now) answers
            first = exc.first_kept
            continue
        if newest is None and events:
            newest = events[-1].ts
        for ev in reversed(events):
            if type(ev) is Snapshot and ev.last_ts is not None:
                return ev.last_ts  # (standing in for the events it covers)
            if not ev.is_maintenance():
                return ev.ts
        seq, window = lo - 1, window * 4
    return newest


class ExpiryResult(msgspec.Struct, frozen=True):
    """One session considered for expiry: its last activity and what happened to it.

    `result`: "deleted", "would delete" (a dry run), "kept" (written to since it was
    judged idle: not deleted), "gone" (deleted by someone else meanwhile) or "failed"
    (`error` says why)."""

    session_id: str
    last_activity: datetime | None
    result: str
    error: str | None = None


def delete_older_than(
    core: CoreOwner,
    age: timedelta,
    *,
    now: datetime | None = None,
    dry_run: bool = False,
    purge: bool = False,
) -> list[ExpiryResult]:
    """Delete every session whose last event is older than `age` (as of `now`).

    Each session is judged and removed on its own (`expire_one`); one that fails is
    reported and the rest go on. A session written to (or removed and created anew)
    since it was judged is kept: its head (sequence number and link) is checked again
    by the tombstone's own expected-head append, so an append racing the delete either
    lands first (the session is kept) or is refused by the tombstone. Tombstoned
    sessions are passed over. With `purge` (no tombstone) the head is read again just
    before the removal, and an append landing in the instant between is removed with
    the session, exactly as when it races an explicit `delete_session(purge=True)`.
    """
    core = core_of(core)
    flag(dry_run, "dry_run")
    flag(purge, "purge")
    # refused before any session is judged (a naive `now` would raise a bare TypeError
    # at the first comparison)
    if not isinstance(age, timedelta) or age < timedelta(0):
        raise InvalidArgumentError(f"age must be a timedelta >= 0, not {age!r}")
    if now is not None and (not isinstance(now, datetime) or now.utcoffset() is None):
        raise InvalidArgumentError(f"now must be a timezone-aware datetime, not {now!r}")
    try:
        cutoff = (now or datetime.now(UTC)) - age
    except OverflowError:
        return []  # older than the calendar: no session is
    results: list[ExpiryResult] = []
    core.check_open()
    for sid in tombstone.live_sessions(core):
        res = expire_one(core, sid, cutoff, dry_run=dry_run, purge=purge)
        if res is not None:
            results.append(res)
    return results


def expire_one(
    core: SessionCore, session_id: str, cutoff: datetime, *, dry_run: bool, purge: bool
) -> ExpiryResult | None:
    """Judge one session against `cutoff` and delete it if its last activity is older
    (see `delete_older_than`); None when it is not idle. Errors are a "failed" result.

    Without `purge` the tombstone's own expected-head append re-checks the head judged
    (`tombstone.delete_session(if_head=)`): a write landing first keeps the session, one
    landing after is refused; with `purge` the head is read again just before."""
    try:
        # the chain point (seq and link), not the seq alone: a session removed and
        # created anew meanwhile may have as many events; a compaction keeps it
        head = _head(core, session_id)
        when = last_activity(core, session_id)
        if when is None or when >= cutoff:
            return None
        if dry_run:
            return ExpiryResult(session_id, when, "would delete")
        if purge:
            if not _head(core, session_id).same_chain_point(head):
                return ExpiryResult(session_id, when, "kept")
            removed = delete_session(core, session_id, purge=True)
            return ExpiryResult(session_id, when, "deleted" if removed else "gone")
        if tombstone.delete_session(core, session_id, if_head=head):
            return ExpiryResult(session_id, when, "deleted")
        # not deleted: written to meanwhile (kept), or deleted or purged by another
        moved = tombstone.tombstone_of(core, session_id) is None and _head(core, session_id).seq
        return ExpiryResult(session_id, when, "kept" if moved else "gone")
    except (EventStoreError, OSError) as exc:
        return ExpiryResult(session_id, None, "failed", " ".join(str(exc).split()))


def _head(core: SessionCore, session_id: str) -> Head:
    """The session's head, read from the engine now."""
    core.session(session_id)  # validates the id, checks the store is open
    return core.engine.head(session_id)


# -- pruning archived history ----------------------------------------------------------------

_line_head = HEAD_DECODER


class PruneReport(msgspec.Struct, frozen=True):
    """What `prune_archive` removed: the archived `segments` (oldest first) and the
    sequence number of the `archive_pruned` event that records it (None: nothing was
    old enough, nothing written)."""

    session_id: str
    segments: list[PrunedSegment] = msgspec.field(default_factory=list)
    event_seq: int | None = None

    @property
    def bytes(self) -> int:
        """The bytes removed."""
        return sum(s.size for s in self.segments)


def _last_head(data: bytes) -> LineHead | None:
    """The envelope of the last line of an archived log (its newest)."""
    for line in reversed(data.rstrip(b"\n").split(b"\n")):
        if line.strip():
            try:
                return _line_head.decode(line)
            except msgspec.MsgspecError:
                return None
    return None


def _last_time(data: bytes) -> datetime | None:
    """The time of the last line of an archived log."""
    head = _last_head(data)
    return None if head is None else head.ts


def _last_link(data: bytes) -> str:
    """The link the line after an archived log chains to ("" if its last line is bad)."""
    head = _last_head(data)
    if head is None:
        return ""
    return (head.base_h or "") if head.type == "snapshot" else head.h


def _check_kept_chains(
    where: str, data: bytes, dropped: list[tuple[int, int, str, int]], last_h: str
) -> None:
    """CorruptLogError unless the first line kept (`data`'s, when it is the event after
    the last one `dropped`) chains to `last_h`, the link the pruning record will name:
    read from a damaged last line, it would leave the kept history failing its check for
    good once the segment holding the truth is gone. A snapshot chains to its own
    base_h: nothing to check then."""
    nl = data.find(b"\n")
    if not dropped or nl < 0:
        return
    first = data[:nl]
    try:
        head = _line_head.decode(first)
    except msgspec.MsgspecError:
        return  # a damaged first line kept: the chain check of readers reports it
    if head.type == "snapshot" or head.seq != dropped[-1][1] + 1:
        return
    if not hash_checks(last_h.encode(), first, head.h):
        raise CorruptLogError(
            where, 0, head.seq,
            f"the first event kept does not chain to {last_h or 'the empty link'}, the"
            f" link of seq {dropped[-1][1]} in {dropped[-1][2]} (a damaged line there, or"
            " here): nothing was pruned; run verify",
        )  # fmt: skip


def prune_archive(
    core: CoreOwner, session_id: str, before: int | datetime, *, dry_run: bool = False
) -> PruneReport:
    """Remove the session's archived segments that lie wholly before `before`: a
    sequence number (every event of the segment has a smaller one) or an aware time
    (its newest line is older). Only the oldest segments go, never one after a segment
    that stays, and never the live log. An `archive_pruned` event naming the range and
    the segments is appended first, so a crash in between leaves the files and the
    record of the intent; running it again removes them (and records that too).

    Afterwards history starts at the first event kept (`history.first_kept_seq`):
    `read_events` from an earlier seq and `state_at` needing a pruned event raise
    HistoryPrunedError, `verify` reports the pruned range as a warning. Compaction
    carries the record into its snapshot, so this holds after any later compaction.
    UnsupportedError, writing nothing, for an engine that cannot prune.
    `dry_run`: report the segments that would go (`event_seq` None), change nothing.
    """
    core = core_of(core)
    flag(dry_run, "dry_run")
    core.session(session_id)  # validates the id, checks the store is open
    if isinstance(before, bool) or not isinstance(before, (int, datetime)):
        raise InvalidArgumentError(
            f"before must be a sequence number or a datetime, not {before!r}"
        )
    if isinstance(before, datetime) and before.utcoffset() is None:
        raise InvalidArgumentError("before must be a timezone-aware datetime")
    if isinstance(before, int) and before < 1:
        raise InvalidArgumentError(f"before must be a sequence number >= 1, not {before}")
    engine = core.engine
    if not isinstance(engine, PruningEngine):
        raise UnsupportedError(f"the {engine.url} engine cannot prune archived history")
    dropped: list[tuple[int, int, str, int]] = []
    last_h = ""
    with engine.history(session_id) as hist:
        for seg in hist:
            if not seg.archived or seg.first_seq is None or seg.last_seq is None:
                _check_kept_chains(seg.where, seg.read(), dropped, last_h)
                break
            if isinstance(before, int):
                old = seg.last_seq < before
            else:
                when = _last_time(seg.read())
                old = when is not None and when < before
            if not old:
                _check_kept_chains(seg.where, seg.read(), dropped, last_h)
                break
            dropped.append((seg.first_seq, seg.last_seq, PurePath(seg.where).name, seg.size))
            last_h = _last_link(seg.read())  # the last dropped one's is kept
    if not dropped:
        return PruneReport(session_id)
    if dry_run:
        return PruneReport(session_id, [PrunedSegment(n, f, la, z) for f, la, n, z in dropped])
    asked = f"seq {before}" if isinstance(before, int) else before.astimezone(UTC).isoformat()
    event = ArchivePruned(
        first_seq=dropped[0][0],
        last_seq=dropped[-1][1],
        segments=[name for _, _, name, _ in dropped],
        bytes=sum(size for *_, size in dropped),
        before=asked,
        last_h=last_h,
    )
    result = core.write_events(session_id, [event], None)  # (append refuses the kind)
    segments = engine.prune_history(session_id, dropped[-1][1] + 1)
    return PruneReport(session_id, segments, result.first_seq)
