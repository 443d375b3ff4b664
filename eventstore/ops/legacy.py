"""Import the older design's per-session JSON state files into a store.

The older design kept each session's whole state in one JSON file:

    <legacy dir>/sessions/<lowercase hex of the UTF-8 session id>.json

holding one object (every key optional but `manifest`; absent lists are empty):

    {
      "manifest": {"session_id": "...", "active_branch": "main",
                   "current_objective": "...", "schema_version": 1,
                   "harness_version": "v0", "last_known_good_commit": null,
                   "init_plan": {"steps": [
                       {"kind": "command", "program": "npm", "args": ["ci"]},
                       {"kind": "shell_script", "shell": "bash", "script": "make"}]},
                   "metadata": {"k": "v"}},                     (or null: no manifest yet)
      "feature_list": [{"id": "f1", "category": "core", "description": "...",
                        "steps": ["..."], "passes": false}],
      "recent_progress": [{"run_id": "r1", "summary": "...",
                           "created_at_secs": 1767225600, "created_at_nanos": 500000000}],
      "checkpoints": [{"run_id": "r1", "started_at_secs": 1767225600,
                       "started_at_nanos": 0, "completed_at_secs": null,
                       "completed_at_nanos": null, "status": "in_progress",
                       "note": null}],
      "transcript": [{"role": "user", "content": "..."}]
    }

Times are Unix seconds (`*_secs`, UTC) plus nanoseconds within that second (`*_nanos`,
0..999,999,999, default 0); a completion time is absent or null when the run has not
completed. Python datetimes hold microseconds, so digits below a microsecond are dropped.
Init steps are tagged by `kind` ("command" or "shell_script"); statuses and roles are the
lowercase enum values (`in_progress`, `succeeded`, `failed`; `system`, `user`,
`assistant`, `tool`).

Each file becomes one session (the id decoded from the file name) whose state equals
the file's, written as one atomic batch with the idempotency key
`legacy-import:<sha256 of the file bytes>` and only into an empty session. A second
run imports nothing: a file already imported, or a session that already has events, is
skipped and reported. A file that cannot be read or decoded (a FIFO or device is not
read; a time past the calendar, a feature id twice are refused as the store refuses
them) is reported as failed, and the others are still imported.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import msgspec

from eventstore.core.session_core import AppendResult, CoreOwner, SessionCore, core_of
from eventstore.core.validation import feature_list
from eventstore.engines.base import Head
from eventstore.errors import (
    ConcurrencyError,
    EventStoreError,
    InvalidRecordError,
)
from eventstore.format.events import (
    CheckpointRecorded,
    Event,
    FeatureListReplaced,
    ManifestSet,
    MessagesAppended,
    ProgressAppended,
)
from eventstore.records import (
    FeatureRecord,
    Message,
    ProgressEntry,
    RunCheckpoint,
    RunStatus,
    SessionManifest,
)
from eventstore.regular import read_regular
from eventstore.session_ids import validate_session_id

__all__ = [
    "ImportItem",
    "ImportReport",
    "LegacyCheckpoint",
    "LegacyProgress",
    "LegacySession",
    "import_legacy",
    "legacy_file_name",
    "read_legacy_file",
]

KEY_PREFIX = "legacy-import:"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class LegacyProgress(msgspec.Struct):
    """A progress entry of the older format."""

    run_id: str
    summary: str
    created_at_secs: int
    created_at_nanos: int = 0


class LegacyCheckpoint(msgspec.Struct):
    """A run checkpoint of the older format (completion time absent or null if none)."""

    run_id: str
    started_at_secs: int
    started_at_nanos: int = 0
    completed_at_secs: int | None = None
    completed_at_nanos: int | None = None
    status: RunStatus = RunStatus.IN_PROGRESS
    note: str | None = None


class LegacySession(msgspec.Struct):
    """One legacy session file. Manifest records and init steps have the new shape."""

    manifest: SessionManifest | None = None
    feature_list: list[FeatureRecord] = msgspec.field(default_factory=list)
    recent_progress: list[LegacyProgress] = msgspec.field(default_factory=list)
    checkpoints: list[LegacyCheckpoint] = msgspec.field(default_factory=list)
    transcript: list[Message] = msgspec.field(default_factory=list)


class ImportItem(msgspec.Struct):
    """What happened to one file."""

    file: str
    session_id: str | None
    result: Literal["imported", "skipped", "failed"]
    events: int
    detail: str


class ImportReport(msgspec.Struct):
    """What `import_legacy` did, file by file, and the totals."""

    items: list[ImportItem]
    imported: int
    skipped: int
    failed: int


def legacy_file_name(session_id: str) -> str:
    """The file name the older design used for a session id."""
    return session_id.encode("utf-8").hex() + ".json"


def _time(secs: int, nanos: int | None, what: str) -> datetime:
    nanos = nanos or 0
    if not 0 <= nanos < 1_000_000_000:
        raise ValueError(f"{what}_nanos is {nanos}, not within 0..999999999")
    # timedelta arithmetic, not fromtimestamp: exact for any second, no float rounding
    try:
        return _EPOCH + timedelta(seconds=secs, microseconds=nanos // 1000)
    except OverflowError:  # not a ValueError: it would escape the file's own failure
        raise ValueError(f"{what}_secs is {secs}, outside the years 1..9999") from None


_decoder = msgspec.json.Decoder(LegacySession)


def read_legacy_file(data: bytes) -> tuple[LegacySession, list[Event]]:
    """Decode one legacy file and turn it into the events that rebuild its state."""
    legacy = _decoder.decode(data)
    events: list[Event] = []
    if legacy.manifest is not None:
        events.append(ManifestSet(manifest=legacy.manifest))
    if legacy.feature_list:
        # refused as `replace_feature_list` refuses it (an id twice): a state no session
        # call could make
        events.append(
            FeatureListReplaced(features=feature_list(legacy.feature_list, "feature_list"))
        )
    for p in legacy.recent_progress:
        entry = ProgressEntry(
            run_id=p.run_id,
            summary=p.summary,
            created_at=_time(p.created_at_secs, p.created_at_nanos, "created_at"),
        )
        events.append(ProgressAppended(entry=entry))
    for c in legacy.checkpoints:
        completed = None
        if c.completed_at_secs is not None:
            completed = _time(c.completed_at_secs, c.completed_at_nanos, "completed_at")
        cp = RunCheckpoint(
            run_id=c.run_id,
            started_at=_time(c.started_at_secs, c.started_at_nanos, "started_at"),
            completed_at=completed,
            status=c.status,
            note=c.note,
        )
        events.append(CheckpointRecorded(checkpoint=cp))
    if legacy.transcript:
        events.append(MessagesAppended(messages=legacy.transcript))
    return legacy, events


def _import_file(core: SessionCore, path: Path) -> ImportItem:
    name = str(path)
    try:
        session_id = bytes.fromhex(path.stem).decode("utf-8")
        validate_session_id(session_id)
    except (ValueError, UnicodeDecodeError) as exc:
        return ImportItem(name, None, "failed", 0, f"the file name is not a hex session id: {exc}")
    try:
        # a FIFO planted in the legacy directory would block the open forever, a link
        # to a device (/dev/zero) would be read without end: refused (OSError)
        data = read_regular(path)
        legacy, events = read_legacy_file(data)
    except (
        OSError,
        msgspec.DecodeError,
        msgspec.ValidationError,
        ValueError,
        InvalidRecordError,
    ) as exc:
        return ImportItem(name, session_id, "failed", 0, " ".join(str(exc).split()))
    if not events:
        return ImportItem(name, session_id, "skipped", 0, "the file holds an empty state")
    key = KEY_PREFIX + hashlib.sha256(data).hexdigest()
    note = ""
    if legacy.manifest is not None and legacy.manifest.session_id != session_id:
        note = f"; the manifest names session {legacy.manifest.session_id!r}"
    try:
        # reading the session may fail too (a damaged log, a planted symlink): that
        # fails this file alone
        if core.loaded(session_id, core.idempotency, lambda seen: key in seen):
            return ImportItem(name, session_id, "skipped", 0, "already imported (same content)")
        # expected_seq=0: only into an empty session, never on top of other history
        result = _append_to_empty(core, session_id, events, key)
    except ConcurrencyError as exc:
        return ImportItem(
            name, session_id, "skipped", 0, f"the session already has {exc.actual} events"
        )
    except EventStoreError as exc:
        return ImportItem(name, session_id, "failed", 0, " ".join(str(exc).split()))
    if result.replayed:
        return ImportItem(name, session_id, "skipped", 0, "already imported (same content)")
    n = result.last_seq - result.first_seq + 1
    return ImportItem(name, session_id, "imported", n, f"seq 1..{result.last_seq}{note}")


def _append_to_empty(
    core: SessionCore, session_id: str, events: list[Event], key: str
) -> AppendResult:
    """Append `events` under `key` only into an empty session (ConcurrencyError)."""
    checked = [core.codec.check(e) for e in events]

    def build(head: Head, states: list[Any]) -> list[Event]:
        if head.seq != 0:
            raise ConcurrencyError(session_id, 0, head.seq)
        return checked

    result = core.write(session_id, build, key)
    assert result is not None  # build never returns []
    return result


def import_legacy(core: CoreOwner, legacy_dir: str | Path) -> ImportReport:
    """Import every `sessions/*.json` under `legacy_dir` (see the module docstring).

    Idempotent; one bad file never stops the others.
    """
    core = core_of(core)
    base = Path(legacy_dir) / "sessions"
    items = [_import_file(core, p) for p in sorted(base.glob("*.json"))]
    return ImportReport(
        items=items,
        imported=sum(1 for i in items if i.result == "imported"),
        skipped=sum(1 for i in items if i.result == "skipped"),
        failed=sum(1 for i in items if i.result == "failed"),
    )
