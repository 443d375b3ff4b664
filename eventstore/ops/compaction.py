"""Compaction: replace a session's log by one snapshot, atomically, beside live writers.

Written once for every engine. The face reads the live log up to its head, folds every
registered projection (rebuilding from the archive a state an older snapshot lacks),
lets each projection trim its state if a `Retention` asks it to (opt-in), and encodes a
`snapshot` line at the head's sequence number N linked to the head's link. The engine
installs it atomically (`Engine.install_snapshot`): lines other writers appended after
N meanwhile are kept after the snapshot (they chain to its `base_h`), and the replaced
lines stay in the session's history when `archive` is true. If another compaction
replaced the log first, it is read again and compacted again.

A compaction that would not make the live log smaller is skipped and changes nothing:
the log is empty, already one snapshot, or the snapshot would take at least as many
bytes as the lines it replaces (a log of a few small events: a snapshot holds every
projection's state and the list of known types). The report says which (`skipped`).

The `archive_pruned` records of the lines replaced, and those the snapshot before
carried, are kept verbatim in the new snapshot (`Snapshot.pruned`): the point history
was pruned to is read from the live log whatever compactions follow. So is a forked
session's `origin` (`eventstore.ops.fork`).
"""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from typing import Literal

import msgspec

from eventstore import entropy
from eventstore.core.folding import fold_events
from eventstore.core.segments import pruning_records
from eventstore.core.session_core import CoreOwner, SessionCore, core_of
from eventstore.core.validation import described, flag
from eventstore.engines.base import HeadMovedError, ReadResult
from eventstore.errors import InvalidArgumentError
from eventstore.format.codec import EventCodec
from eventstore.format.events import (
    Event,
    SessionDeleted,
    Snapshot,
    UnknownEvent,
)
from eventstore.format.reader import read_lines
from projections import (
    Retention,
    in_snapshots,
    retain,
    snapshot_entry,
    stored_in_snapshot,
)
from projections.lifecycle import is_erased_tombstone

__all__ = ["CompactionReport", "Retention", "SkipReason", "build_snapshot", "compact"]

_ATTEMPTS = 20  # installs lost to a concurrent compaction before giving up (never seen)


SkipReason = Literal["no_events", "one_snapshot", "would_not_shrink", "deleted"]
"""Why a compaction was skipped: the session has no events; its log is already one
snapshot (and no retention was asked for); the snapshot would be at least as large as
the live log it replaces; the session was deleted (its tombstone is erased by
`delete_session`, never archived by a compaction)."""


class CompactionReport(msgspec.Struct, frozen=True):
    """What one compaction did. `compacted` is False when it was skipped: `skipped` says
    why (`notes` in words) and nothing changed (`bytes_after == bytes_before`).
    `snapshot_bytes`: the size of the snapshot line written, or that would have been
    written (0 when none was built). `archive`: the name of the archived segment that keeps
    the replaced log (the engine's name: a path for the file engine, a URL-like name
    elsewhere), None without an archive; `archive_path`: that file, for the file engine
    only (None elsewhere). `dry_run`: it was one (`compact(dry_run=True)`): nothing
    changed, and the sizes after are what a compaction would leave."""

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
    notes: list[str] = msgspec.field(default_factory=list)
    skipped: SkipReason | None = None
    snapshot_bytes: int = 0
    archive: str | None = None
    dry_run: bool = False


def _last_activity(events: list[Event]) -> datetime | None:
    """The time of the newest event that is not maintenance among `events` (a snapshot
    among them answers for the events it covers), None when no line knows it."""
    for ev in reversed(events):
        if type(ev) is Snapshot:
            return ev.last_ts
        if not ev.is_maintenance():
            return ev.ts
    return None


def compact(
    core: CoreOwner,
    session_id: str,
    *,
    archive: bool = True,
    retention: Retention | None = None,
    force: bool = False,
    dry_run: bool = False,
) -> CompactionReport:
    """Replace the session's log by one snapshot line; see the module docstring.
    `force`: compact even when the snapshot would not be smaller than the log (an empty
    session, or a lone snapshot with no retention asked for, is still skipped).
    `dry_run`: decide and build the snapshot as a compaction would, write nothing, and
    report what it would do (`dry_run` True, `compacted` False, `skipped` as a
    compaction would skip it, sizes after as they would be)."""
    core = core_of(core)
    flag(archive, "archive")
    flag(force, "force")
    flag(dry_run, "dry_run")
    if retention is not None and not isinstance(retention, Retention):
        raise InvalidArgumentError(f"retention must be a Retention, not {described(retention)}")
    t0 = time.perf_counter()
    sess = core.session(session_id)
    engine = core.engine
    codec = core.codec
    for _ in range(_ATTEMPTS):
        res = engine.read(session_id, None)
        covers = res.head
        if covers.seq == 0:
            return CompactionReport(
                session_id, 0, 0, 0, 0, 0, 0, None, time.perf_counter() - t0, False,
                notes=["the session has no events"], skipped="no_events", dry_run=dry_run,
            )  # fmt: skip
        events = read_lines(res.data, codec, codec.decoder(None), res.where).events
        first_seq = events[0].seq
        last = events[-1]
        size = covers.size
        if type(last) is SessionDeleted or (
            len(events) == 1 and is_erased_tombstone(last)
            and retention is not None and _tombstoned(core, session_id)
        ):  # fmt: skip
            return CompactionReport(
                session_id, len(events), len(events), size, size, first_seq, last.seq, None,
                time.perf_counter() - t0, False, notes=["the session was deleted"],
                skipped="deleted", dry_run=dry_run,
            )  # fmt: skip
        if len(events) == 1 and type(last) is Snapshot and retention is None:
            return CompactionReport(
                session_id, 1, 1, size, size, first_seq, last.seq, None,
                time.perf_counter() - t0, False, notes=["the log is already one snapshot"],
                skipped="one_snapshot", snapshot_bytes=size, dry_run=dry_run,
            )  # fmt: skip
        states, folded, trimmed = _fold_states(core, session_id, res, events, retention)
        snap = build_snapshot(events, states, res.data[:size], covers.link, codec, archive, trimmed)
        unknown = snap.unknown
        cipher = core.snapshot_cipher(session_id, "compaction")
        line, _ = codec.encode_snapshot(snap, covers.seq, covers.link, entropy.now(), cipher)
        if len(line) >= size and not force:
            return CompactionReport(
                session_id, len(events), len(events), size, size, first_seq, last.seq, None,
                time.perf_counter() - t0, False, unknown_kept=len(unknown),
                notes=[f"the snapshot ({len(line)} bytes) would not be smaller than the"
                       f" log ({size} bytes)"],
                skipped="would_not_shrink", snapshot_bytes=len(line), dry_run=dry_run,
            )  # fmt: skip
        if dry_run:
            return CompactionReport(
                session_id, len(events), 1, size, len(line), first_seq, last.seq, None,
                time.perf_counter() - t0, False, unknown_kept=len(unknown),
                notes=["a dry run: nothing was written"], snapshot_bytes=len(line),
                dry_run=True,
            )  # fmt: skip
        try:
            done = engine.install_snapshot(session_id, line, covers, keep_history=archive)
        except HeadMovedError:
            continue  # another compaction (or a repair) replaced the log: read it again
        with sess.lock:
            core.forget(session_id)  # the new log has a new identity: every fold restarts from it
            sess.head = done.head
        if done.head.seq == covers.seq:  # nothing after the snapshot: the states are current
            core.caches.save_fold_caches(session_id, done.head, folded)
            core.caches.vouch_for_snapshot(sess, line, done.head)
        return CompactionReport(
            session_id=session_id,
            events_before=len(events),
            events_after=1,
            bytes_before=size,
            bytes_after=len(line),
            first_seq=first_seq,
            last_seq=last.seq,
            archive_path=done.archived_path,
            archive=done.archived,
            seconds=time.perf_counter() - t0,
            unknown_kept=len(unknown),
            snapshot_bytes=len(line),
        )
    raise HeadMovedError(res.where, covers, engine.head(session_id))


def _tombstoned(core: SessionCore, session_id: str) -> bool:
    return core.loaded(session_id, core.lifecycle, core.lifecycle.copy).deleted is not None


def _fold_states(
    core: SessionCore,
    session_id: str,
    res: ReadResult,
    events: list[Event],
    retention: Retention | None,
) -> tuple[dict[str, msgspec.Raw], dict[str, object], bool]:
    """Every projection's state folded over the live log `res` (and trimmed by
    `retention`): as snapshot entries, as states, and whether anything was trimmed."""
    codec = core.codec
    states: dict[str, msgspec.Raw] = {}
    folded: dict[str, object] = {}
    # whether the states are no state as of the log's end (a retention dropped something,
    # now or in the snapshot they were folded from): history must not take them for one
    trimmed = type(events[0]) is Snapshot and events[0].trimmed
    for name, proj in core.projections.items():
        if not in_snapshots(proj):
            folded[name] = proj.initial()  # what a load of the new log folds: none stored
            continue
        # a user's apply may change the events it is given: it folds a decode of its
        # own, as a cold load gives it (the built-in projections, and those that say
        # their apply never changes one, share one)
        own = (
            events
            if name in core.sharing
            else read_lines(res.data, codec, codec.decoder(proj.event_types), res.where).events
        )
        state = fold_events(codec, core.engine, session_id, proj, proj.initial(), own, res.where)
        entry = snapshot_entry(proj, state)
        if retention is not None:
            state = retain(proj, state, retention)
            kept = snapshot_entry(proj, state)
            trimmed = trimmed or bytes(kept) != bytes(entry)
            entry = kept
        if stored_in_snapshot(proj, state):
            states[name] = entry
        folded[name] = state
    return states, folded, trimmed


def build_snapshot(
    events: list[Event],
    states: dict[str, msgspec.Raw],
    data: bytes | memoryview,
    link: str,
    codec: EventCodec,
    archive: bool,
    trimmed: bool,
) -> Snapshot:
    """The snapshot of `events` (a live log whose committed bytes are `data`) with
    `states`, linked to `link` (the last event's): the events no projection here decodes
    kept verbatim, the pruning records in `data` carried (a fork passes no `data`)."""
    unknown: list[msgspec.Raw] = []
    for ev in events:
        if type(ev) is Snapshot:
            unknown.extend(ev.unknown)
        elif type(ev) is UnknownEvent:
            unknown.append(msgspec.Raw(ev.raw))
    known = sorted(t for t in codec.types if t != "snapshot")
    committed = bytes(data)  # (`read` gives bytes: no copy when whole)
    records = {rec.seq: raw for rec, raw in pruning_records(committed)}  # each once
    return Snapshot(
        base_h=link,
        states=states,
        unknown=unknown,
        known=known,
        pruned=[msgspec.Raw(raw) for raw in records.values()],
        archived=archive,
        trimmed=trimmed,
        last_ts=_last_activity(events),
        # a fork's origin outlives compactions of the fork (verify checks it where it is)
        origin=events[0].origin if type(events[0]) is Snapshot else None,
    )
