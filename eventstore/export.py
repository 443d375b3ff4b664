"""Stats and export of a session's history, and the one-line summaries the CLI shows.

`stats` counts events per type and the bytes an engine keeps; `export_jsonl` gives the
history's lines verbatim (each event once, so consecutive hashes still check);
`export_session` the current state as one JSON document.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any

import msgspec

from .events import Event, Snapshot, UnknownEvent
from .history import iter_history, require_history
from .log import read_lines

if TYPE_CHECKING:
    from .store import SessionStore

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


def stats(store: SessionStore, session_id: str) -> SessionStats:
    """Events per type, first/last sequence and time, bytes of the log and the archive.

    `events` counts the events whose lines are still in some segment; a snapshot
    standing in for history compacted without an archive is counted under "snapshot"
    and its covered events in `compacted_without_archive`.
    """
    envelopes = store.codec.decoder(frozenset())  # payloads are never materialized
    with require_history(store, session_id) as hist:
        log_bytes = log_events = snapshots = 0
        archive_bytes = archive_files = 0
        for seg in hist.segments:
            if seg.archived:
                archive_files += 1
                archive_bytes += seg.size
            else:
                log_bytes = seg.size
                events = read_lines(seg.read(), store.codec, envelopes, seg.where).events
                log_events = len(events)
                snapshots += sum(1 for e in events if type(e) is Snapshot)
        by_type: dict[str, int] = {}
        first: Event | None = None
        last: Event | None = None
        lost = 0
        for ev, _ in iter_history(store, session_id, envelopes, history=hist):
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
    require_history(store, session_id).close()
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
    with require_history(store, session_id) as hist:
        for _, line in iter_history(
            store, session_id, store.codec.decoder(frozenset()), history=hist
        ):
            yield line + b"\n"
