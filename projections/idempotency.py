"""The idempotency projection: the recent idempotency keys of a session and their results.

Kept like any other projection (folded, snapshotted), so keys survive restarts and
compaction. Bounded: the newest `MAX_KEYS` keys are kept.
"""

# no `from __future__ import annotations`: msgspec reads these structs' annotations
# as objects, not strings to evaluate; that keeps decoder builds on cold loads ~3x cheaper
from eventstore.format.events import Event
from projections.base import StructProjection

__all__ = ["MAX_KEYS", "IdempotencyProjection"]

MAX_KEYS = 1000

# key -> (first seq, last seq) of the batch it was given to; dicts keep insertion order
Keys = dict[str, tuple[int, int]]


class IdempotencyProjection(StructProjection[Keys]):
    """Idempotency key -> (first seq, last seq) of the batch it was given to."""

    name = "idempotency"
    version = 1
    event_types = frozenset()  # only envelopes: the key is on a batch's first line
    state_type = Keys

    def initial(self) -> Keys:
        """An empty state."""
        return {}

    def apply(self, state: Keys, event: Event) -> Keys:
        """Fold one event into the state."""
        key = event.key
        if key is not None:
            state[key] = (event.seq, event.seq + event.more)
            if len(state) > MAX_KEYS:
                del state[next(iter(state))]
        return state
