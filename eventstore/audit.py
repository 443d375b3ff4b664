"""Audit and replay, by name: a façade over the modules that do each job.

    eventstore.history   read_events, state_at, transcript_at, history_files
    eventstore.verify    verify, VerifyReport, Problem
    eventstore.repair    repair, RepairReport
    eventstore.follow    follow
    eventstore.export    stats, export_jsonl, export_session, event_summary, event_to_json

Kept so that `from eventstore import audit; audit.verify(store, sid)` (and the CLI)
keep working; new code may import the modules directly.
"""

from __future__ import annotations

from .errors import HistoryUnavailableError, UnknownSessionError
from .export import (
    SessionStats,
    event_summary,
    event_to_json,
    export_jsonl,
    export_session,
    stats,
)
from .follow import follow
from .history import LogFile, history_files, read_events, state_at, transcript_at
from .log import Problem
from .repair import RepairReport, repair
from .verify import VerifyReport, verify

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
