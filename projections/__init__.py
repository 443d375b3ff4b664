"""Pure folds from events to the state a harness reads. No I/O happens here, and no
module state is kept (a decoder a projection builds when first needed is kept by that
projection instance; what modules hold is constant).

Built in: `BootstrapProjection` (-> `BootstrapState`), `TranscriptProjection`
(-> `list[Message]`) and `IdempotencyProjection` (recent idempotency keys). Define your
own by implementing `Projection` (or subclassing `StructProjection`).
"""

from projections.base import (
    Projection,
    Retention,
    StructProjection,
    fold,
    is_retained,
    restore_state,
    retain,
    snapshot_entry,
)
from projections.bootstrap import BootstrapProjection
from projections.idempotency import (
    MAX_KEYS,
    IdempotencyProjection,
)
from projections.lifecycle import Lifecycle, LifecycleProjection
from projections.transcript import TranscriptProjection

__all__ = [
    "MAX_KEYS",
    "BootstrapProjection",
    "IdempotencyProjection",
    "Lifecycle",
    "LifecycleProjection",
    "Projection",
    "Retention",
    "StructProjection",
    "TranscriptProjection",
    "fold",
    "is_retained",
    "restore_state",
    "retain",
    "snapshot_entry",
]
