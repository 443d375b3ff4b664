"""Pure folds from events to the state a harness reads. No I/O happens here.

Built in: `BootstrapProjection` (-> `BootstrapState`), `TranscriptProjection`
(-> `list[Message]`) and `IdempotencyProjection` (recent idempotency keys). Define your
own by implementing `Projection` (or subclassing `StructProjection`).
"""

from .base import Projection, StructProjection, fold, restore_state, snapshot_entry
from .bootstrap import BootstrapProjection
from .idempotency import MAX_KEYS, IdempotencyProjection
from .transcript import TranscriptProjection

__all__ = [
    "MAX_KEYS",
    "BootstrapProjection",
    "IdempotencyProjection",
    "Projection",
    "StructProjection",
    "TranscriptProjection",
    "fold",
    "restore_state",
    "snapshot_entry",
]
