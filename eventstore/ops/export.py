"""Stats and export of a session's history, and the one-line summaries the CLI shows.

`stats` counts events per type and the bytes an engine keeps; `export_jsonl` gives the
history's lines verbatim (each event once, so consecutive hashes still check);
`export_session` the current state as one JSON document.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

import msgspec

from eventstore.core.session_core import CoreOwner, core_of
from eventstore.format.events import (
    CheckpointRecorded,
    Event,
    FeatureListReplaced,
    FeaturePassUpdated,
    ManifestSet,
    MessagesAppended,
    ProgressAppended,
    Sealed,
    Snapshot,
    UnknownEvent,
)
from eventstore.format.reader import read_lines
from eventstore.ops.history import (
    iter_history,
    require_history,
)

__all__ = [
    "SessionStats",
    "event_summary",
    "event_to_json",
    "export_jsonl",
    "export_session",
    "stats",
]


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


def stats(core: CoreOwner, session_id: str) -> SessionStats:
    """Events per type, first/last sequence and time, bytes of the log and the archive.

    `events` counts the events whose lines are still in some segment; a snapshot
    standing in for history compacted without an archive is counted under "snapshot"
    and its covered events in `compacted_without_archive`.
    """
    core = core_of(core)
    envelopes = core.codec.decoder(frozenset())  # payloads are never materialized
    with require_history(core, session_id) as hist:
        log_bytes = log_events = snapshots = 0
        archive_bytes = archive_files = 0
        for seg in hist.segments:
            if seg.archived:
                archive_files += 1
                archive_bytes += seg.size
            else:
                log_bytes = seg.size
                events = read_lines(seg.read(), core.codec, envelopes, seg.where).events
                log_events = len(events)
                snapshots += sum(1 for e in events if type(e) is Snapshot)
        by_type: dict[str, int] = {}
        first: Event | None = None
        last: Event | None = None
        lost = 0
        for ev, _ in iter_history(core, session_id, envelopes, history=hist):
            if type(ev) is Snapshot:
                lost += ev.seq - (last.seq if last is not None else 0)
            tag = ev.type_name if type(ev) is UnknownEvent else type(ev).__struct_config__.tag
            by_type[str(tag)] = by_type.get(str(tag), 0) + 1
            if first is None:
                first = ev
            last = ev
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
    """A one-line human summary of an event's payload (`log`, `follow`, reports)."""
    if type(ev) is UnknownEvent:
        return f"(unknown type {ev.type_name!r})"
    if isinstance(ev, ManifestSet):
        m = ev.manifest
        steps = len(m.init_plan.steps) if m.init_plan else 0
        return (
            f"objective: {m.current_objective} (branch {m.active_branch},"
            f" commit {m.last_known_good_commit or '-'}, {plural(steps, 'init step')})"
        )
    if isinstance(ev, FeatureListReplaced):
        fs = ev.features
        done = sum(1 for f in fs if f.passes)
        ids = ", ".join(f.id for f in fs)
        return f"{plural(len(fs), 'feature')} ({done} passing)" + (f": {ids}" if fs else "")
    if isinstance(ev, FeaturePassUpdated):
        return f"{ev.feature_id} -> {'passes' if ev.passes else 'fails'}"
    if isinstance(ev, ProgressAppended):
        return f"[{ev.entry.run_id}] {ev.entry.summary}"
    if isinstance(ev, CheckpointRecorded):
        c = ev.checkpoint
        return f"[{c.run_id}] {c.status.value}" + (f": {c.note}" if c.note else "")
    if isinstance(ev, MessagesAppended):
        ms = ev.messages
        head = f": {ms[0].role.value}: {ms[0].content}" if ms else ""
        return plural(len(ms), "message") + head
    if isinstance(ev, Snapshot):
        o = ev.origin
        fork = "" if o is None else f"forked from {o.session_id} at seq {o.seq} (hash {o.h}): "
        return f"{fork}snapshot of seq 1..{ev.seq} (base_h {ev.base_h}; {', '.join(ev.states)})"
    if isinstance(ev, Sealed):
        return f"seal of seq {ev.sealed_seq} (h {ev.sealed_h}) by key {ev.key_id}"
    payload = {
        k: v
        for k, v in event_to_json(ev).items()
        if k not in ("type", "seq", "ts", "more", "key", "v", "h")
    }
    return _json.encode(payload).decode()


def plural(n: int, noun: str, nouns: str | None = None) -> str:
    """`1 entry`, `2 entries`, `0 features`."""
    return f"{n} {noun if n == 1 else (nouns or noun + 's')}"


def export_session(core: CoreOwner, session_id: str) -> dict[str, Any]:
    """One session as a JSON-ready document: its current bootstrap state, transcript,
    last sequence number and head hash, all as of one head (beside a writer too)."""
    core = core_of(core)
    require_history(core, session_id).close()
    sess = core.session(session_id)
    # one picture: both projections caught up to the same head, and turned into
    # builtins (a copy) under the session's lock, which a writer folding a batch holds
    with sess.lock:
        head, (state, transcript) = core.fold_to_one_head(sess, (core.bootstrap, core.transcript))
        return {
            "session_id": session_id,
            "last_seq": head.seq,
            "head_hash": head.link,
            "state": msgspec.to_builtins(state),
            "transcript": msgspec.to_builtins(transcript),
        }


def export_jsonl(core: CoreOwner, session_id: str) -> Iterator[bytes]:
    """The raw lines (with newline) of the history, each event once, as `read_events`
    selects them: verbatim, so the hashes of consecutive lines still check."""
    core = core_of(core)
    with require_history(core, session_id) as hist:
        for _, line in iter_history(
            core, session_id, core.codec.decoder(frozenset()), history=hist
        ):
            yield line + b"\n"
