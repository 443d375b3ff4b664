"""Where raw log bytes end: the last complete batch of bytes a repair rewrote or cut.

Engines that keep a live log as bytes of their own (memory, Redis) find its head from
the bytes themselves after `RepairHold.rewrite`: the last line that closes a batch
(`more == 0`) and decodes, what it chains to, and the seq the log opens with. One
function, so every such engine reads a damaged log the same way.
"""

from __future__ import annotations

from typing import Any

import msgspec

from eventstore.format.depth import HEAD_DECODER

__all__ = ["LineEnd", "RawEnd", "last_line_end", "raw_end"]

_head_decoder = HEAD_DECODER  # reads the envelope of a line of any depth


class RawEnd(msgspec.Struct, frozen=True):
    """The committed end of raw log bytes: `end` (the byte after the last complete
    batch), its line's `seq`, `link` (what the next line chains to) and `h`, and
    `first_seq` (the seq of the first line; 1 when it does not decode)."""

    end: int
    seq: int
    link: str
    h: str
    first_seq: int


class LineEnd(msgspec.Struct, frozen=True):
    """A line's `seq`, `link` (what the line after it chains to: its `h`, a snapshot's
    `base_h`), `h` and `start` (its offset in the bytes it was read from)."""

    seq: int
    link: str
    h: str
    start: int


def last_line_end(data: bytes) -> LineEnd | None:
    """The last line of `data` (whole lines, each ending in a newline; not empty), None
    when it does not decode: what a head read with the bytes must match."""
    start = data.rfind(b"\n", 0, len(data) - 1) + 1
    try:
        last = _head_decoder.decode(data[start:-1])
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return LineEnd(last.seq, _link_after(last), last.h, start)


def _link_after(head: Any) -> str:
    """What the line after a line of envelope `head` chains to."""
    return (head.base_h or "") if head.type == "snapshot" else head.h


def raw_end(data: bytes) -> RawEnd | None:
    """The last complete batch of `data` (None when it holds none)."""
    end = data.rfind(b"\n")
    first_seq = 0
    nl = data.find(b"\n")
    if nl > 0:
        try:
            first_seq = _head_decoder.decode(data[:nl]).seq
        except (msgspec.DecodeError, msgspec.ValidationError):
            first_seq = 1
    while end >= 0:
        prev = data.rfind(b"\n", 0, end)
        try:
            last = _head_decoder.decode(data[prev + 1 : end])
        except (msgspec.DecodeError, msgspec.ValidationError):
            end = prev
            continue
        if last.more == 0:
            return RawEnd(end + 1, last.seq, _link_after(last), last.h, first_seq)
        end = prev
    return None
