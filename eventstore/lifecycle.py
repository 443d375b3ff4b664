"""Session lifecycle: deleting sessions, and expiring those idle for longer than an age.

Owns the policy above `SessionStore.delete_session` (which removes one session's log,
history and caches atomically, on every engine): which sessions are old enough to go,
judged by the time of their last event, and removing them one by one so that a failure
on one never stops the rest. The `eventstore delete` command is a view of it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from .errors import EventStoreError
from .events import Snapshot
from .store import SessionStore

__all__ = ["ExpiryResult", "delete_older_than", "last_activity", "parse_age"]

_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_age(text: str) -> timedelta:
    """`30d`, `12h`, `90m`, `45s`, `2w` (a number and a unit) as a timedelta; ValueError
    naming the text otherwise."""
    m = _AGE.match(text)
    if m is None:
        raise ValueError(f"not an age: {text!r} (give a number and a unit: 30d, 12h, 90m, 45s, 2w)")
    return timedelta(seconds=float(m.group(1)) * _UNIT[m.group(2)])


def last_activity(store: SessionStore, session_id: str) -> datetime | None:
    """When the session's last event was appended (None for a session with none).

    A compaction snapshot is not activity: after one, the time of the last event it
    covers is read from the archive (or, compacted without one, the snapshot's time).
    """
    seq = store.last_seq(session_id)
    if seq == 0:
        return None
    found: datetime | None = None
    for ev in store.read_events(session_id, from_seq=seq, to_seq=seq):
        found = ev.ts
        if type(ev) is not Snapshot:
            break
    return found


@dataclass(frozen=True, slots=True)
class ExpiryResult:
    """One session considered for expiry: its last activity and what happened to it.

    `result`: "deleted", "would delete" (a dry run), "kept" (written to since it was
    judged idle: not deleted), "gone" (deleted by someone else meanwhile) or "failed"
    (`error` says why)."""

    session_id: str
    last_activity: datetime | None
    result: str
    error: str | None = None


def delete_older_than(
    store: SessionStore,
    age: timedelta,
    *,
    now: datetime | None = None,
    dry_run: bool = False,
) -> list[ExpiryResult]:
    """Delete every session whose last event is older than `age` (as of `now`).

    Each session is judged and removed on its own; one that fails is reported and the
    rest go on. Just before removing a session its last sequence number is read again,
    and a session written to since it was judged is kept; an append that lands in the
    instant between that check and the removal is removed with the session, exactly as
    when it races an explicit `delete_session`.
    """
    if age < timedelta(0):
        raise ValueError("age must not be negative")
    cutoff = (now or datetime.now(UTC)) - age
    results: list[ExpiryResult] = []
    for sid in store.list_sessions():
        try:
            seq = store.last_seq(sid)
            when = last_activity(store, sid)
            if when is None or when >= cutoff:
                continue
            if dry_run:
                results.append(ExpiryResult(sid, when, "would delete"))
            elif store.last_seq(sid) != seq:
                results.append(ExpiryResult(sid, when, "kept"))
            else:
                removed = store.delete_session(sid)
                results.append(ExpiryResult(sid, when, "deleted" if removed else "gone"))
        except (EventStoreError, OSError) as exc:
            results.append(ExpiryResult(sid, None, "failed", " ".join(str(exc).split())))
    return results
