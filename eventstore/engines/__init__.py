"""Storage engines: the interface (`base`: `Engine` and the capability interfaces), the
engines behind it, chosen by URL, and the conformance suite every engine passes
(`eventstore.engines.conformance`, imported only by tests).

`open_engine("path" | "file:///abs" | "memory://" | "memory://NAME" | "postgresql://...")`
returns the engine a store URL names; engine modules are imported only when used.
"""

from eventstore.engines.base import (
    EMPTY_HEAD,
    BytesSegment,
    CachingEngine,
    ColdStart,
    EncodedBatch,
    Engine,
    FeedEngine,
    Head,
    HeadMovedError,
    History,
    IndexingEngine,
    InstallResult,
    LiveView,
    Position,
    PrunedSegment,
    PruningEngine,
    RangedEngine,
    ReadResult,
    RepairHold,
    Segment,
    SeqEngine,
    SeqLine,
    open_engine,
)

__all__ = [
    "EMPTY_HEAD",
    "BytesSegment",
    "CachingEngine",
    "ColdStart",
    "EncodedBatch",
    "Engine",
    "FeedEngine",
    "Head",
    "HeadMovedError",
    "History",
    "IndexingEngine",
    "InstallResult",
    "LiveView",
    "Position",
    "PrunedSegment",
    "PruningEngine",
    "RangedEngine",
    "ReadResult",
    "RepairHold",
    "Segment",
    "SeqEngine",
    "SeqLine",
    "open_engine",
]
