"""eventstore: durable, fast, tamper-evident session memory for AI agent harnesses.

Each session is an append-only event log kept by a storage engine (JSON Lines files by
default; memory; PostgreSQL); projections fold it into the state a harness reads;
compaction rewrites a long log into a snapshot atomically.

    from eventstore import SessionStore, SessionManifest
    with SessionStore(".eventstore") as store:        # or "memory://", "postgresql://..."
        store.initialize_session_if_missing("s1", SessionManifest(...), features)
        state = store.load_bootstrap_state("s1")

The names below are imported on first use, so `import eventstore` stays cheap and
`projections` (which the store builds on) can be imported first. Extension points:
`Event` (custom events), `Projection` / `StructProjection` (custom folds), and the
storage engine interface (`Engine` and its types, `open_engine`; see
`eventstore.engines.base`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

from eventstore.moved import install as _install_moved_paths  # noqa: E402

_install_moved_paths()  # release 0.1.0's module paths keep importing (eventstore.moved)

_EXPORTS: dict[str, str] = {
    "ConcurrencyError": ".errors",
    "CorruptLogError": ".errors",
    "EventStoreError": ".errors",
    "FeatureNotFoundError": ".errors",
    "HistoryPrunedError": ".errors",
    "HistoryUnavailableError": ".errors",
    "IdempotencyConflictError": ".errors",
    "InvalidArgumentError": ".errors",
    "InvalidRecordError": ".errors",
    "InvalidSessionIdError": ".errors",
    "NestingTooDeepError": ".errors",
    "SessionDeletedError": ".errors",
    "SessionExistsError": ".errors",
    "SnapshotVersionError": ".errors",
    "StorageError": ".errors",
    "StoreClosedError": ".errors",
    "UnknownEngineError": ".errors",
    "UnknownProjectionError": ".errors",
    "UnknownSessionError": ".errors",
    "UnsafePathError": ".errors",
    "SigningKeyError": ".errors",
    "KeyMissingError": ".errors",
    "KeyForgottenError": ".errors",
    "WrongKeyError": ".errors",
    "EncryptedSessionError": ".errors",
    "KeyRing": ".format.crypt",
    "KeyForgotten": ".format.events",
    "ArchivePruned": ".format.events",
    "CheckpointRecorded": ".format.events",
    "Event": ".format.events",
    "FeatureListReplaced": ".format.events",
    "FeaturePassUpdated": ".format.events",
    "ForkOrigin": ".format.events",
    "SessionDeleted": ".format.events",
    "ManifestSet": ".format.events",
    "MessagesAppended": ".format.events",
    "ProgressAppended": ".format.events",
    "Quarantined": ".format.events",
    "Sealed": ".format.events",
    "SealWitnessed": ".format.events",
    "Snapshot": ".format.events",
    "UnknownEvent": ".format.events",
    "BootstrapState": ".records",
    "FeatureRecord": ".records",
    "InitCommand": ".records",
    "InitPlan": ".records",
    "InitShell": ".records",
    "InitShellScript": ".records",
    "Message": ".records",
    "ContentBlock": ".records",
    "ImageBlock": ".records",
    "TextBlock": ".records",
    "ThinkingBlock": ".records",
    "ToolResultBlock": ".records",
    "ToolUseBlock": ".records",
    "ProgressEntry": ".records",
    "Role": ".records",
    "RunCheckpoint": ".records",
    "RunStatus": ".records",
    "SessionManifest": ".records",
    "AppendResult": ".store",
    "SessionCacheInfo": ".core.session_core",
    "SessionInfo": ".ops.listing",
    "LabelsSet": ".format.events",
    "Tuning": ".core.tuning",
    "AutoCompact": ".store",
    "SessionStore": ".store",
    "CompactionReport": ".ops.compaction",
    "SkipReason": ".ops.compaction",
    "Projection": "projections",
    "Retention": "projections",
    "StructProjection": "projections",
    "Engine": ".engines.base",
    "EncodedBatch": ".engines.base",
    "Head": ".engines.base",
    "HeadMovedError": ".engines.base",
    "History": ".engines.base",
    "InstallResult": ".engines.base",
    "Position": ".engines.base",
    "ReadResult": ".engines.base",
    "RepairHold": ".engines.base",
    "Segment": ".engines.base",
    "open_engine": ".engines.base",
    "VerifyReport": ".ops.verify",
    "Problem": ".format.reader",
    "RepairReport": ".ops.repair",
    "SessionStats": ".ops.export",
    "ForkResult": ".ops.fork",
    "SealFacts": ".ops.seal",
    "SealPolicy": ".ops.seal",
    "Tombstone": ".ops.tombstone",
    "Policy": ".ops.retention",
    "GcReport": ".ops.retention",
    "FORGET_BY_A2A": ".harness_sessions",
    "FORGET_BY_CLI": ".harness_sessions",
    "HARNESS_SESSION_FILE_NAME": ".harness_sessions",
    "HARNESS_SESSION_TYPE": ".harness_sessions",
    "HarnessSessionMap": ".harness_sessions",
    "new_harness_session_id": ".harness_sessions",
}

__all__ = [
    "ArchivePruned",
    "EncryptedSessionError",
    "KeyForgotten",
    "KeyForgottenError",
    "KeyMissingError",
    "KeyRing",
    "WrongKeyError",
    "ContentBlock",
    "ImageBlock",
    "TextBlock",
    "ThinkingBlock",
    "ToolResultBlock",
    "ToolUseBlock",
    "AppendResult",
    "AutoCompact",
    "BootstrapState",
    "CheckpointRecorded",
    "CompactionReport",
    "ConcurrencyError",
    "CorruptLogError",
    "EncodedBatch",
    "Engine",
    "Event",
    "EventStoreError",
    "FORGET_BY_A2A",
    "FORGET_BY_CLI",
    "FeatureListReplaced",
    "FeatureNotFoundError",
    "FeaturePassUpdated",
    "FeatureRecord",
    "ForkOrigin",
    "ForkResult",
    "GcReport",
    "HARNESS_SESSION_FILE_NAME",
    "HARNESS_SESSION_TYPE",
    "HarnessSessionMap",
    "Head",
    "HeadMovedError",
    "History",
    "HistoryPrunedError",
    "HistoryUnavailableError",
    "IdempotencyConflictError",
    "InitCommand",
    "InitPlan",
    "InitShell",
    "InitShellScript",
    "InstallResult",
    "InvalidArgumentError",
    "InvalidRecordError",
    "InvalidSessionIdError",
    "ManifestSet",
    "Message",
    "MessagesAppended",
    "NestingTooDeepError",
    "Policy",
    "Position",
    "Problem",
    "ProgressAppended",
    "Quarantined",
    "ProgressEntry",
    "Projection",
    "ReadResult",
    "RepairHold",
    "RepairReport",
    "Retention",
    "Role",
    "RunCheckpoint",
    "RunStatus",
    "Segment",
    "SessionManifest",
    "SessionCacheInfo",
    "SessionDeleted",
    "SessionDeletedError",
    "SessionInfo",
    "LabelsSet",
    "SessionExistsError",
    "SessionStats",
    "SealFacts",
    "SealPolicy",
    "SealWitnessed",
    "Sealed",
    "SessionStore",
    "SigningKeyError",
    "SkipReason",
    "Snapshot",
    "SnapshotVersionError",
    "StorageError",
    "Tuning",
    "StoreClosedError",
    "StructProjection",
    "Tombstone",
    "UnknownEngineError",
    "UnknownEvent",
    "UnknownProjectionError",
    "UnknownSessionError",
    "UnsafePathError",
    "VerifyReport",
    "new_harness_session_id",
    "open_engine",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'eventstore' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


if TYPE_CHECKING:
    from eventstore.core.session_core import SessionCacheInfo
    from eventstore.core.tuning import Tuning
    from eventstore.engines.base import (
        EncodedBatch,
        Engine,
        Head,
        HeadMovedError,
        History,
        InstallResult,
        Position,
        ReadResult,
        RepairHold,
        Segment,
        open_engine,
    )
    from eventstore.errors import (
        ConcurrencyError,
        CorruptLogError,
        EventStoreError,
        FeatureNotFoundError,
        HistoryPrunedError,
        HistoryUnavailableError,
        IdempotencyConflictError,
        InvalidArgumentError,
        InvalidRecordError,
        InvalidSessionIdError,
        NestingTooDeepError,
        SessionDeletedError,
        SnapshotVersionError,
        StorageError,
        StoreClosedError,
        UnknownEngineError,
        UnknownProjectionError,
        UnknownSessionError,
        UnsafePathError,
    )
    from eventstore.format.events import (
        CheckpointRecorded,
        Event,
        FeatureListReplaced,
        FeaturePassUpdated,
        LabelsSet,
        ManifestSet,
        MessagesAppended,
        ProgressAppended,
        SessionDeleted,
        Snapshot,
        UnknownEvent,
    )
    from eventstore.format.reader import Problem
    from eventstore.harness_sessions import (
        FORGET_BY_A2A,
        FORGET_BY_CLI,
        HARNESS_SESSION_FILE_NAME,
        HARNESS_SESSION_TYPE,
        HarnessSessionMap,
        new_harness_session_id,
    )
    from eventstore.ops.compaction import (
        CompactionReport,
        SkipReason,
    )
    from eventstore.ops.export import SessionStats
    from eventstore.ops.listing import SessionInfo
    from eventstore.ops.repair import RepairReport
    from eventstore.ops.retention import GcReport, Policy
    from eventstore.ops.tombstone import Tombstone
    from eventstore.ops.verify import VerifyReport
    from eventstore.records import (
        BootstrapState,
        FeatureRecord,
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
    )
    from eventstore.store import (
        AppendResult,
        AutoCompact,
        SessionStore,
    )
    from projections import (
        Projection,
        Retention,
        StructProjection,
    )
