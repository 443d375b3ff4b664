"""Audit and replay, by name: a façade over the modules that do each job.

    eventstore.ops.history   read_events, state_at, transcript_at, history_files
    eventstore.ops.verify    verify, VerifyReport, Problem
    eventstore.ops.repair    repair, RepairReport
    eventstore.ops.follow    follow
    eventstore.ops.export    stats, export_jsonl, export_session, event_summary, event_to_json

Kept so that `from eventstore import audit; audit.verify(store, sid)` (and the CLI)
keep working; new code may import the modules directly.
"""

from __future__ import annotations

from eventstore.errors import (
    HistoryUnavailableError,
    UnknownSessionError,
)
from eventstore.format.reader import Problem
from eventstore.ops.export import (
    SessionStats,
    event_summary,
    event_to_json,
    export_jsonl,
    export_session,
    stats,
)
from eventstore.ops.follow import follow
from eventstore.ops.history import (
    LogFile,
    history_files,
    read_events,
    state_at,
    transcript_at,
)
from eventstore.ops.repair import (
    RepairReport,
    repair,
)
from eventstore.ops.verify import (
    VerifyReport,
    verify,
)

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
