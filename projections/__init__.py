"""Pure folds from events to the state a harness reads. No I/O happens here, and no
module state is kept (a decoder a projection builds when first needed is kept by that
projection instance; what modules hold is constant).

Built in: `BootstrapProjection` (-> `BootstrapState`), `TranscriptProjection`
(-> `list[Message]`), `IdempotencyProjection` (recent idempotency keys) and
`LabelsProjection` (a session's labels). Define your
own by implementing `Projection` (or subclassing `StructProjection`).
"""

from projections.base import (
    Projection,
    Retention,
    StructProjection,
    fold,
    in_snapshots,
    is_retained,
    restore_state,
    retain,
    snapshot_entry,
    stored_in_snapshot,
)
from projections.bootstrap import BootstrapProjection
from projections.idempotency import (
    MAX_KEYS,
    IdempotencyProjection,
)
from projections.labels import LabelsProjection
from projections.lifecycle import Lifecycle, LifecycleProjection
from projections.transcript import TranscriptProjection

__all__ = [
    "MAX_KEYS",
    "BootstrapProjection",
    "IdempotencyProjection",
    "Lifecycle",
    "LifecycleProjection",
    "LabelsProjection",
    "Projection",
    "Retention",
    "StructProjection",
    "TranscriptProjection",
    "fold",
    "in_snapshots",
    "is_retained",
    "restore_state",
    "retain",
    "snapshot_entry",
    "stored_in_snapshot",
]
