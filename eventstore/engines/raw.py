"""Where raw log bytes end: the last complete batch of bytes a repair rewrote or cut.

Engines that keep a live log as bytes of their own (memory, Redis) find its head from
the bytes themselves after `RepairHold.rewrite`: the last line that closes a batch
(`more == 0`) and decodes, what it chains to, and the seq the log opens with. One
function, so every such engine reads a damaged log the same way.
"""

from __future__ import annotations

import msgspec

from eventstore.format.depth import HEAD_DECODER

__all__ = ["RawEnd", "raw_end"]

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
            link = (last.base_h or "") if last.type == "snapshot" else last.h
            return RawEnd(end + 1, last.seq, link, last.h, first_seq)
        end = prev
    return None
