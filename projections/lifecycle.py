"""The lifecycle projection: whether a session is deleted, and its tombstone.

Folded by every write (the store refuses to write after a tombstone) and by the reads
that report deletion (`deleted_sessions`, `verify`). Its state is a `Lifecycle`; a
snapshot written before this projection existed holds no entry for it and derives the
live state (no snapshot predates a tombstone).
"""

# no `from __future__ import annotations`: msgspec reads these structs' annotations
# as objects, not strings to evaluate
import msgspec

from eventstore.format.events import Event, SessionDeleted, Snapshot
from projections.base import StructProjection

__all__ = ["Lifecycle", "LifecycleProjection", "is_erased_tombstone"]


class Lifecycle(msgspec.Struct, omit_defaults=True):
    """A session's lifecycle: `deleted`, its tombstone (None: the session is live)."""

    deleted: SessionDeleted | None = None


class LifecycleProjection(StructProjection[Lifecycle]):
    """A session's tombstone, if it has one (see the module docstring)."""

    name = "lifecycle"
    version = 1
    # a tombstone always ends its log: the last line alone decides the state, so a first
    # fold reads only that line where the engine can (eventstore.core.last_line)
    last_line_only = True
    event_types = frozenset({"session_deleted"})
    ignores_other_types = True  # a writer skips batches of no type it reads
    state_type = Lifecycle
    absent_is_initial = True  # a snapshot of a live session stores no lifecycle

    def initial(self) -> Lifecycle:
        """A live session."""
        return Lifecycle()

    def apply(self, state: Lifecycle, event: Event) -> Lifecycle:
        """Fold one event into the state: a tombstone deletes the session."""
        if type(event) is SessionDeleted:
            return Lifecycle(event)
        return state

    def state_from_snapshot(self, snapshot: Snapshot) -> Lifecycle:
        """A snapshot without this projection's entry (written before it existed, or by
        a store without it): a live session, since a tombstone ends every log."""
        return Lifecycle()


def is_erased_tombstone(ev: Event) -> bool:
    """Whether `ev` is a deleted session's erased log: a snapshot holding the lifecycle's
    state (a live session's snapshots store none: `absent_is_initial`)."""
    return type(ev) is Snapshot and LifecycleProjection.name in ev.states
