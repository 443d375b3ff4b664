"""The transcript projection: events -> the conversation's messages, in append order."""

# no `from __future__ import annotations`: msgspec reads these structs' annotations
# as objects, not strings to evaluate; that keeps decoder builds on cold loads ~3x cheaper
from itertools import compress
from operator import attrgetter, or_

import msgspec

from eventstore.events import Event, MessagesAppended
from eventstore.records import Message

from .base import Retention, StructProjection, is_suffix, keep_last

__all__ = ["TranscriptProjection", "copy_message"]

_MESSAGE = msgspec.json.Decoder(Message)
_encode = msgspec.json.Encoder().encode
_get_blocks = attrgetter("blocks")
_get_metadata = attrgetter("metadata")


def copy_message(message: Message) -> Message:
    """`message` itself if nothing in it can change, else a deep copy.

    A message is frozen, but the lists and dicts of a rich one (`blocks`, tool `input`,
    `metadata`) are not: those are copied, so a caller changing them never changes the
    store's state. Plain messages (role and text) are shared.
    """
    if message.blocks or message.metadata:
        return _MESSAGE.decode(_encode(message))
    return message


class TranscriptProjection(StructProjection[list[Message]]):
    """Every message of every `messages_appended` event."""

    name = "transcript"
    version = 1
    event_types = frozenset({"messages_appended"})
    state_type = list[Message]

    def initial(self) -> list[Message]:
        """An empty state."""
        return []

    def apply(self, state: list[Message], event: Event) -> list[Message]:
        """Fold one event into the state."""
        if type(event) is MessagesAppended:
            state.extend(event.messages)
        return state

    def copy(self, state: list[Message]) -> list[Message]:
        """A new list of the same messages; the mutable parts of rich ones copied."""
        out = list(state)
        # which messages are rich, found by C-level maps: plain ones cost nothing here
        rich = map(or_, map(bool, map(_get_blocks, out)), map(bool, map(_get_metadata, out)))
        for i in compress(range(len(out)), rich):
            out[i] = copy_message(out[i])
        return out

    def retain(self, state: list[Message], retention: Retention) -> list[Message]:
        """Keep the newest `retention.messages` messages."""
        return keep_last(state, retention.messages)

    def retained_from(self, stored: list[Message], full: list[Message]) -> bool:
        """Whether `stored` is the newest part of `full`."""
        return is_suffix(stored, full)
