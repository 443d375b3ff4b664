"""The labels projection: the labels `set_labels` last gave a session (`labels_set`).

Kept like any other projection (folded, snapshotted), so a session's labels survive
compaction and a rebuild of the session index reads them back from the log.
"""

# no `from __future__ import annotations`: msgspec reads these structs' annotations
# as objects, not strings to evaluate
from eventstore.format.events import Event, LabelsSet
from projections.base import StructProjection

__all__ = ["LabelsProjection"]

Labels = dict[str, str]


class LabelsProjection(StructProjection[Labels]):
    """A session's labels (key -> value), as the last `labels_set` event set them."""

    name = "labels"
    version = 1
    event_types = frozenset({"labels_set"})
    ignores_other_types = True  # a writer skips batches of no type it reads
    state_type = Labels
    absent_is_initial = True  # a snapshot of a session without labels stores none

    def initial(self) -> Labels:
        """No labels."""
        return {}

    def apply(self, state: Labels, event: Event) -> Labels:
        """The labels of a `labels_set` event replace the state."""
        if type(event) is LabelsSet:
            return dict(event.labels)
        return state
