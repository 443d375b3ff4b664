"""The transcript projection: events -> the conversation's messages, in append order."""

# no `from __future__ import annotations`: msgspec reads these structs' annotations
# as objects, not strings to evaluate; that keeps decoder builds on cold loads ~3x cheaper
from datetime import UTC
from typing import Any

import msgspec

from eventstore.format.events import (
    Event,
    MessagesAppended,
)
from eventstore.records import Message
from projections.base import (
    Retention,
    StructProjection,
    is_suffix,
    keep_last,
)

__all__ = ["TranscriptProjection", "copy_message"]

_MESSAGE = msgspec.json.Decoder(Message)
_encode = msgspec.json.Encoder().encode
_replace = msgspec.structs.replace
_msgpack_encode = msgspec.msgpack.Encoder().encode
FRAME_MESSAGES = 512
"""Messages per fold-cache frame: about 1 MB of a transcript of 2 kB messages, what a
cold load holds of the cache at once besides the state it builds."""


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
    ignores_other_types = True  # a writer skips batches of no type it reads
    state_type = list[Message]
    cache_folds = True  # kept in the fold cache, in MessagePack frames (`cache_frames`)

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

    def cache_frames(self, state: list[Message]) -> list[bytes]:
        """The state in frames of `FRAME_MESSAGES` for the fold cache: MessagePack,
        which decodes about twice as fast as JSON (its strings need no unescaping),
        where it reads back exactly; JSON for a frame holding a time with an offset
        (MessagePack keeps the instant, not the offset) or a number it cannot hold."""
        return self.cache_frames_from(state, 0)[0]

    def cache_frames_from(
        self, state: list[Message], start: int, stop: int | None = None
    ) -> tuple[list[bytes], int]:
        """`cache_frames`' frames from frame `start` on, and how many of them are
        complete (`FRAME_MESSAGES` each: appends never change them). With `stop`: only
        the complete frames before frame `stop` (none when there is none: no encoding)."""
        full = len(state) // FRAME_MESSAGES
        if stop is not None and full <= start:
            return [], 0  # (after every append: no complete frame yet)
        if stop is None:
            ends = range(start * FRAME_MESSAGES, len(state), FRAME_MESSAGES)
        else:
            ends = range(start * FRAME_MESSAGES, min(stop, full) * FRAME_MESSAGES, FRAME_MESSAGES)
        frames = [_frame(state[i : i + FRAME_MESSAGES]) for i in ends]
        return frames, min(len(frames), max(0, full - start))

    def from_cache_frame(self, state: list[Message], frame: bytes) -> list[Message]:
        """The state with the messages of one `cache_frames` frame appended (ValueError
        for an empty frame, which `cache_frames` never writes)."""
        kind = frame[:1]
        if frame in (b"", b"[]", b"\x90"):  # an empty list, in either encoding
            raise ValueError("an empty frame")
        # a decoder per encoding, built when first needed and kept by this projection
        # (projections hold no module state)
        decoders: dict[bytes, Any] = self.__dict__.setdefault("_frame_decoders", {})
        decoder = decoders.get(kind)
        if decoder is None:
            decoder = decoders[kind] = (
                msgspec.json.Decoder(list[Message])
                if kind == b"["
                else msgspec.msgpack.Decoder(list[Message])
            )
        state.extend(decoder.decode(frame))
        return state

    def retain(self, state: list[Message], retention: Retention) -> list[Message]:
        """Keep the newest `retention.messages` messages."""
        return keep_last(state, retention.messages)

    def retained_from(self, stored: list[Message], full: list[Message]) -> bool:
        """Whether `stored` is the newest part of `full`."""
        return is_suffix(stored, full)


def _frame(part: list[Message]) -> bytes:
    """One frame of `cache_frames` (see there)."""
    if all(m.created_at is None or m.created_at.tzinfo is UTC for m in part):
        try:
            return _msgpack_encode(part)
        except (msgspec.EncodeError, OverflowError):
            pass  # an integer past 64 bits, which JSON holds
    return _encode(part)
