"""The transcript projection: events -> the conversation's messages, in append order."""

# no `from __future__ import annotations`: msgspec reads these structs' annotations
# as objects, not strings to evaluate; that keeps decoder builds on cold loads ~3x cheaper
import msgspec

from eventstore.events import Event, MessagesAppended
from eventstore.records import Message

from .base import Retention, StructProjection, is_suffix, keep_last

__all__ = ["TranscriptProjection", "copy_message"]

_MESSAGE = msgspec.json.Decoder(Message)
_encode = msgspec.json.Encoder().encode
_replace = msgspec.structs.replace


def copy_message(message: Message) -> Message:
    """A copy of `message` that the caller owns.

    A message is frozen, but its `blocks` and `metadata` (and a tool call's `input`)
    are a list and dicts: a rich message is copied deep, a plain one gets empty ones of
    its own (its text is shared: strings cannot change), so a caller changing them
    never changes the store's state, nor another copy.
    """
    if message.blocks or message.metadata:
        return _MESSAGE.decode(_encode(message))
    return _replace(message, blocks=[], metadata={})


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
        """A new list of copies the caller owns (see `copy_message`)."""
        return list(map(copy_message, state))

    def retain(self, state: list[Message], retention: Retention) -> list[Message]:
        """Keep the newest `retention.messages` messages."""
        return keep_last(state, retention.messages)

    def retained_from(self, stored: list[Message], full: list[Message]) -> bool:
        """Whether `stored` is the newest part of `full`."""
        return is_suffix(stored, full)
