"""Storage engines: the interface (`base`) and the engines behind it, chosen by URL.

`open_engine("path" | "file:///abs" | "memory://" | "memory://NAME" | "postgresql://...")`
returns the engine a store URL names; engine modules are imported only when used.
"""

from eventstore.engines.base import (
    EMPTY_HEAD,
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

__all__ = [
    "EMPTY_HEAD",
    "EncodedBatch",
    "Engine",
    "Head",
    "HeadMovedError",
    "History",
    "InstallResult",
    "Position",
    "ReadResult",
    "RepairHold",
    "Segment",
    "open_engine",
]
