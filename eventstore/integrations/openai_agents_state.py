"""What the Agents SDK session stores and how it folds: the three events of
`eventstore.integrations.openai_agents` and the `agents_items` projection (pure).

Kept apart from the session, and free of the Agents SDK, so the `eventstore` command
(which loads `EVENT_TYPES` through the `eventstore.event_types` entry point) names these
events where the SDK is not installed.
"""

# no `from __future__ import annotations`: msgspec reads these structs' annotations
# as objects, not strings to evaluate; that keeps decoder builds on cold loads ~3x cheaper

import msgspec

from eventstore.format.events import Event
from projections import StructProjection

__all__ = [
    "EVENT_TYPES",
    "PROJECTION",
    "PROJECTIONS",
    "AgentItems",
    "AgentItemsProjection",
    "ItemPopped",
    "ItemsAdded",
    "SessionCleared",
    "StoredItem",
]


class ItemsAdded(Event, tag="agents_items_added", kw_only=True, gc=False):
    """`add_items`: the items, each as its JSON."""

    items: list[msgspec.Raw]


class ItemPopped(Event, tag="agents_item_popped", kw_only=True, gc=False):
    """`pop_item`: the item removed, named by the seq of the add that brought it and its
    index in that add (kept in full too, so the log reads as a conversation)."""

    added_seq: int
    index: int
    item: msgspec.Raw


class SessionCleared(Event, tag="agents_session_cleared", kw_only=True, gc=False):
    """`clear_session`: every item is gone from the session (not from the log)."""


EVENT_TYPES: tuple[type[Event], ...] = (ItemsAdded, ItemPopped, SessionCleared)

# The events and items are `gc=False` Structs: they hold only numbers, strings and raw
# JSON, so they cannot form reference cycles, and a cold fold of a long conversation
# decodes thousands of them without waking the cyclic garbage collector.


class StoredItem(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """An item of the conversation, with where it came from."""

    added_seq: int
    index: int
    item: msgspec.Raw


class AgentItems(msgspec.Struct):
    """The conversation as of `seq`, the last event folded (of any type)."""

    seq: int = 0
    items: list[StoredItem] = msgspec.field(default_factory=list)


class AgentItemsProjection(StructProjection[AgentItems]):
    """Items added, minus those popped, since the last clear."""

    name = "agents_items"
    version = 1
    event_types = frozenset({"agents_items_added", "agents_item_popped", "agents_session_cleared"})
    state_type = AgentItems

    def initial(self) -> AgentItems:
        """An empty conversation."""
        return AgentItems()

    def apply(self, state: AgentItems, event: Event) -> AgentItems:
        """Fold one event; every event advances `seq`, so a pop can name its base."""
        if isinstance(event, ItemsAdded):
            state.items.extend(StoredItem(event.seq, i, raw) for i, raw in enumerate(event.items))
        elif isinstance(event, ItemPopped):
            items = state.items
            if items and (items[-1].added_seq, items[-1].index) == (event.added_seq, event.index):
                items.pop()
            else:  # not the tail (only a writer that skipped expected_seq does this)
                state.items = [
                    i for i in items if (i.added_seq, i.index) != (event.added_seq, event.index)
                ]
        elif isinstance(event, SessionCleared):
            state.items = []
        state.seq = event.seq
        return state

    def copy(self, state: AgentItems) -> AgentItems:
        """A copy sharing the immutable items. `seq` is read first: a fold racing this copy
        can only make `seq` older than the items, which makes a pop re-read, never err."""
        seq = state.seq
        return AgentItems(seq, list(state.items))


PROJECTION = AgentItemsProjection()
PROJECTIONS: tuple[AgentItemsProjection, ...] = (PROJECTION,)
