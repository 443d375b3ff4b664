"""How deep a log line may nest, and how deep a piece of JSON nests.

msgspec (like Python's `json`) decodes and encodes nested arrays and objects by recursion,
one level of Python's recursion budget per level of nesting, counted from wherever the
caller's stack already is. A line nested nearly as deep as `sys.getrecursionlimit()`
could be written from a shallow stack and then be unreadable from a deeper one. So an
append whose line would nest deeper than `MAX_DEPTH` is refused (`NestingTooDeepError`,
nothing written; `eventstore.format.codec`), which leaves every reader a margin of
hundreds of stack frames; and a reader that meets a deeper line written by someone
else reports it as a `CorruptLogError` naming the line (`too_deep_reason`), never as a
`RecursionError`.

`depth_of` measures without recursion, and costs two byte counts for a line that holds
fewer brackets than the limit (almost every line). `HEAD_DECODER` reads the envelope
(`LineHead`) of a line of any depth, so engines, recovery and repair find heads and
batches around an over-deep line, and only the line itself is reported.
"""

from __future__ import annotations

import re
from itertools import accumulate

import msgspec

from eventstore.errors import NestingTooDeepError
from eventstore.format.events import LineHead

__all__ = [
    "HEAD_DECODER",
    "MAX_DEPTH",
    "SNAPSHOT_MAX_DEPTH",
    "HeadDecoder",
    "NestingTooDeepError",
    "check_depth",
    "depth_of",
    "shallow",
    "too_deep_reason",
]

MAX_DEPTH = 256
"""The deepest a log line written by an append may nest, in levels of JSON arrays and
objects, the line's own object included (a `messages_appended` line puts a message's
`metadata` at level 4 and a tool call's `input` at level 6). A snapshot wraps states a
few levels deeper: it is held to `SNAPSHOT_MAX_DEPTH`."""

SNAPSHOT_MAX_DEPTH = MAX_DEPTH + 8
"""The deepest a snapshot line may nest: its states (a transcript puts a message two
levels deeper than its `messages_appended` line did) folded from lines that kept to
`MAX_DEPTH`. A custom projection whose state nests deeper is refused a snapshot
(`NestingTooDeepError` naming it, nothing written), which would otherwise replace the
history with a line readers could not decode."""

_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


def depth_of(data: bytes) -> int:
    """How many levels of arrays and objects `data` (JSON) nests: 0 for a scalar, 1 for
    `{}` or `[1]`, 2 for `[[]]`. Without recursion, so any depth is measured."""
    if data.count(b"[") + data.count(b"{") == 0:
        return 0
    # outside strings only: with the escaped backslashes, then the escaped quotes, gone
    # (a backslash stands only in a string's escapes), every other piece between quotes
    unescaped = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    outside = b"".join(unescaped.split(b'"')[::2])
    brackets = outside.translate(None, _NOT_BRACKETS)
    return max(0, max(accumulate(map(_STEP.__getitem__, brackets)), default=0))


def over(data: bytes, limit: int = MAX_DEPTH) -> bool:
    """Whether `data` (JSON) nests deeper than `limit` (two byte counts when it holds no
    more brackets than that)."""
    return data.count(b"[") + data.count(b"{") > limit and depth_of(data) > limit


def check_depth(data: bytes, what: str, limit: int = MAX_DEPTH) -> None:
    """`NestingTooDeepError` if `data`, the JSON of `what`, nests deeper than `limit`."""
    if over(data, limit):
        raise NestingTooDeepError(
            f"{what} nests {depth_of(data)} levels of arrays and objects deep; a log line"
            f" may nest at most {MAX_DEPTH} (eventstore.format.depth.MAX_DEPTH), its"
            " envelope included"
        )


def too_deep_reason(line: bytes) -> str:
    """Why a line that made the decoder run out of recursion is unreadable."""
    return (
        f"the line nests {depth_of(line)} levels of arrays and objects deep, deeper than"
        f" this reader can decode here; appends write at most {MAX_DEPTH}"
    )


def shallow(line: bytes) -> bytes:
    """`line` with every array and object inside its outermost one replaced by `0`: the
    same top-level fields (the envelope among them), nested one level deep at most."""
    out: list[bytes] = []
    depth = start = cut = 0
    for m in _TOKEN.finditer(line):
        c = m.group()[:1]
        if c == b'"':
            continue
        if c in b"[{":
            depth += 1
            if depth == 2:
                start = m.start()
        else:
            depth -= 1
            if depth == 1:
                out += (line[cut:start], b"0")
                cut = m.end()
    out.append(line[cut:])
    return b"".join(out)


class HeadDecoder:
    """`msgspec.json.Decoder(LineHead)` for a line of any depth: a line nested too deep
    to decode whole gives its envelope from `shallow(line)` (msgspec skips a payload's
    fields by recursion too). Raises what msgspec raises for a line that is no event."""

    __slots__ = ("_decode",)

    def __init__(self) -> None:
        self._decode = msgspec.json.Decoder(LineHead).decode

    def decode(self, line: bytes | memoryview) -> LineHead:
        """The envelope of `line` (one line, no newline)."""
        try:
            return self._decode(line)
        except RecursionError:
            return self._decode(shallow(bytes(line)))


HEAD_DECODER = HeadDecoder()
"""The one envelope decoder: every reader of line heads uses it."""
