"""eventstore: durable, fast, tamper-evident session memory for AI agent harnesses.

Each session is an append-only JSON Lines event log; projections fold it into the state
a harness reads; compaction rewrites a long log into a snapshot atomically.

    from eventstore import SessionStore, SessionManifest
    with SessionStore(".eventstore") as store:
        store.initialize_session_if_missing("s1", SessionManifest(...), features)
        state = store.load_bootstrap_state("s1")
"""

from .audit import Problem, RepairReport, SessionStats, VerifyReport
from .compaction import CompactionReport, Retention
from .errors import (
    ConcurrencyError,
    CorruptLogError,
    EventStoreError,
    FeatureNotFoundError,
    HistoryUnavailableError,
    InvalidRecordError,
    InvalidSessionIdError,
    SnapshotVersionError,
    StorageError,
    StoreClosedError,
    UnknownSessionError,
    UnsafePathError,
)
from .events import (
    CheckpointRecorded,
    Event,
    FeatureListReplaced,
    FeaturePassUpdated,
    ManifestSet,
    MessagesAppended,
    ProgressAppended,
    Snapshot,
    UnknownEvent,
)
from .harness_sessions import (
    FORGET_BY_A2A,
    FORGET_BY_CLI,
    HARNESS_SESSION_FILE_NAME,
    HARNESS_SESSION_TYPE,
    HarnessSessionMap,
    new_harness_session_id,
)
from .records import (
    BootstrapState,
    ContentBlock,
    FeatureRecord,
    ImageBlock,
    InitCommand,
    InitPlan,
    InitShell,
    InitShellScript,
    Message,
    ProgressEntry,
    Role,
    RunCheckpoint,
    RunStatus,
    SessionManifest,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from .store import AppendResult, AutoCompact, SessionStore

__version__ = "0.1.0"

__all__ = [
    "FORGET_BY_A2A",
    "FORGET_BY_CLI",
    "HARNESS_SESSION_FILE_NAME",
    "HARNESS_SESSION_TYPE",
    "HarnessSessionMap",
    "new_harness_session_id",
    "AppendResult",
    "AutoCompact",
    "CompactionReport",
    "Retention",
    "BootstrapState",
    "CheckpointRecorded",
    "ConcurrencyError",
    "CorruptLogError",
    "Event",
    "EventStoreError",
    "FeatureListReplaced",
    "FeaturePassUpdated",
    "FeatureNotFoundError",
    "FeatureRecord",
    "HistoryUnavailableError",
    "InitCommand",
    "InitPlan",
    "InitShell",
    "InitShellScript",
    "InvalidRecordError",
    "InvalidSessionIdError",
    "ManifestSet",
    "Message",
    "MessagesAppended",
    "Problem",
    "ProgressAppended",
    "ProgressEntry",
    "RepairReport",
    "Role",
    "RunCheckpoint",
    "RunStatus",
    "SessionManifest",
    "SessionStats",
    "SessionStore",
    "Snapshot",
    "SnapshotVersionError",
    "StorageError",
    "StoreClosedError",
    "UnknownEvent",
    "UnknownSessionError",
    "UnsafePathError",
    "VerifyReport",
    "ContentBlock",
    "ImageBlock",
    "TextBlock",
    "ThinkingBlock",
    "ToolResultBlock",
    "ToolUseBlock",
]
