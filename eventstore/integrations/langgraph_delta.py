"""A LangGraph channel blob stored as its change from the blob before it: how the saver
judges one (`delta_of`) and how the projections apply one (`BlobDelta.applied`).

In a graph, the `messages` channel's new value is the old list plus a message or two,
and LangGraph's serde (msgpack) encodes it as an array header (whose bytes change with
the count), the old items' bytes unchanged, then the new items. So the new blob is
`new[:c] + base[c:] + new[len(base):]` for a small `c`: storing `new[:c]` and the tail
keeps a thread's log linear in its steps instead of quadratic.

A delta names its base by the channel's version in the same namespace (the blob the
saver's head checkpoint held, judged at the exact head the append commits at), and
carries the base's length and a CRC-32 of its first and last `SAMPLE` bytes (`sample_crc`),
so applying it to other bytes is refused (`applied` returns None) instead of giving a
wrong value. A sample, not the whole base: a version names one blob already, and a fold
applies a delta per put, each over a base that may be megabytes (a whole CRC was most of
a cold fold's time).

The full index keeps every version of a channel: applied whole, a thread of N steps
would hold N copies of its message list (quadratic memory and copying). So it keeps a
delta's value LINKED to its base (`BlobDelta.linked` -> `DeltaChain`): the base object
itself, the delta's tail and a small window of rewritten first bytes, materialized in
one join when read (`DeltaChain.whole`). A delta is validated against a chained base as
against whole bytes (type, length, sample CRC), when it is folded.

An older release does not know deltas: it reads the blob's `value`, which for a delta is
`STAND_IN`, a type no serde knows (LangGraph's raises `NotImplementedError: Unknown
serialization type`) over bytes no serde decodes (0xC1 is invalid in msgpack, in UTF-8
JSON and as a pickle opcode). It raises on reading such a channel; it never returns a
wrong value for it.
"""

# no `from __future__ import annotations`: msgspec reads these structs' annotations
# as objects, not strings to evaluate; that keeps decoder builds on cold loads ~3x cheaper

import zlib
from collections.abc import Callable

import msgspec

__all__ = [
    "CHAIN_MAX",
    "MAX_CUT",
    "SAMPLE",
    "STAND_IN_DATA",
    "STAND_IN_TYPE",
    "WINDOW",
    "BlobDelta",
    "DeltaChain",
    "delta_of",
    "sample_crc",
    "whole_at",
]

STAND_IN_TYPE = "eventstore.delta"
STAND_IN_DATA = b"\xc1"

# how far past the first differing byte the unchanged rest may start: a msgpack array
# header is 1, 3 or 5 bytes
MAX_CUT = 16
SAMPLE = 4096
# the first bytes a chain keeps rewritten (`DeltaChain.window`): a delta's head is at
# most 2 * MAX_CUT bytes as the saver cuts it; a longer one (a log written otherwise)
# is applied whole
WINDOW = 64
# the most links over one whole blob: sampling a chained base (each fold of a delta)
# and materializing a value walk the chain, so its length bounds their cost; every
# CHAIN_MAX + 1-th link is kept whole instead, which costs a thread of N steps about
# N/CHAIN_MAX whole copies of a channel instead of N. 128: at 1,000 steps of
# bench.langgraph_list, 64 kept 4 MB more after a read, 256 cost ~10% more fold CPU
CHAIN_MAX = 128


class BlobDelta(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """A channel value as `head + base[len(head):] + tail`, where `base` is the blob of
    the same channel at version `base` in the same namespace (`base_len` bytes long,
    `sample_crc` `base_crc`, of serde type `type`, which is also the value's)."""

    type: str
    base: str
    base_len: int
    base_crc: int
    head: bytes
    tail: bytes

    def applied(self, base_type: str, base: bytes) -> bytes | None:
        """The value's bytes over `base` (of serde type `base_type`); None when `base` is
        not the blob this delta was made against."""
        if not self._fits(base_type, len(base), lambda: sample_crc(base)):
            return None
        return self._over(base)

    def linked(self, base_type: str, base: "bytes | DeltaChain") -> "bytes | DeltaChain | None":
        """The value over `base` (whole bytes, or a chain: the value before, kept
        linked) as a chain linked to it, or as whole bytes where a chain would not be
        cheaper to keep (a head past `WINDOW`, a chain `CHAIN_MAX` links long); None
        when `base` is not the blob this delta was made against, as for `applied`."""
        if isinstance(base, bytes):
            whole = base
            if not self._fits(base_type, len(whole), lambda: sample_crc(whole)):
                return None
            return self._chained(whole, None)
        if not self._fits(base_type, base.length, base.sample_crc):
            return None
        if base.depth >= CHAIN_MAX:
            return self._over(base.whole())
        return self._chained(base.root, base)

    def _chained(self, root: bytes, prev: "DeltaChain | None") -> "bytes | DeltaChain":
        """The value (over a base already checked) linked to `prev` (None: to `root`)."""
        window = root[:WINDOW] if prev is None else prev.window
        h = len(self.head)
        if h > len(window):  # a head rewriting more than the window keeps: whole
            return self._over(root if prev is None else prev.whole())
        new_window = b"".join((self.head, window[h:], self.tail[:WINDOW]))[:WINDOW]
        depth = 1 if prev is None else prev.depth + 1
        length = self.base_len + len(self.tail)
        return DeltaChain(self.type, length, root, new_window, self.tail, prev, depth)

    def _fits(self, base_type: str, base_len: int, crc: Callable[[], int]) -> bool:
        """Whether a base of this type and length, with this sample CRC (computed only
        when the rest matches), is the blob this delta was made against."""
        return base_type == self.type and base_len == self.base_len and crc() == self.base_crc

    def _over(self, base: bytes) -> bytes:
        return b"".join((self.head, memoryview(base)[len(self.head) :], self.tail))


class DeltaChain(msgspec.Struct, frozen=True, gc=False):
    """A value of serde type `type`, `length` bytes long, kept as deltas over the whole
    blob `root`, unapplied: its bytes are `window` (its first `WINDOW` bytes, those a
    delta's head rewrites), then `root` past the window, then the tail of each link in
    order from the oldest (`prev`, None at the first link over `root`), each from where
    the window ends. Links point only at older values (no cycles: `gc=False`), and a
    link keeps the values it is made over alive (a Python reference, not a key)."""

    type: str
    length: int
    root: bytes
    window: bytes
    tail: bytes
    prev: "DeltaChain | None"  # (a string: the class refers to itself)
    depth: int  # links to `root`, this one included: at most CHAIN_MAX

    def whole(self) -> bytes:
        """The value's bytes: one join over the chain's pieces (linear in its length)."""
        return b"".join(self._pieces())

    def sample_crc(self) -> int:
        """`sample_crc` of the value's bytes, from the pieces it samples only: its first
        bytes from the window and the root, its last from the newest tails (a fold takes
        it for every delta over a chain, so walking the whole chain each time made
        folding a thread quadratic in its links), each CRC'd in place (no copies)."""
        if self.length <= 2 * SAMPLE:
            return sample_crc(self.whole())
        w = len(self.window)
        if len(self.root) >= SAMPLE:
            crc = zlib.crc32(memoryview(self.root)[w:SAMPLE], zlib.crc32(self.window))
        else:
            crc = zlib.crc32(_span(self._pieces(), 0, SAMPLE))
        for piece in self._last(SAMPLE):
            crc = zlib.crc32(piece, crc)
        return crc

    def _last(self, n: int) -> list[memoryview]:
        """The value's last `n` bytes, as slices in order, for `n` that does not reach
        back into the window: past its window the value is `root` then each link's
        tail, oldest first, so it ends with the newest tails (and the root's end when
        they are shorter than `n`)."""
        ends = []
        link: DeltaChain | None = self
        while link is not None and n > 0:
            tail = link.tail
            ends.append(memoryview(tail)[max(0, len(tail) - n) :])
            n -= len(tail)
            link = link.prev
        if n > 0:
            ends.append(memoryview(self.root)[len(self.root) - n :])
        ends.reverse()
        return ends

    def _pieces(self) -> list[bytes | memoryview]:
        """The value's bytes in order, as slices (none copied)."""
        links: list[DeltaChain] = []
        link: DeltaChain | None = self
        while link is not None:
            links.append(link)
            link = link.prev
        w = len(self.window)
        pieces: list[bytes | memoryview] = [self.window, memoryview(self.root)[w:]]
        for link in reversed(links):
            covered = w - (link.length - len(link.tail))  # its first bytes in the window
            pieces.append(link.tail if covered <= 0 else memoryview(link.tail)[covered:])
        return pieces


def _span(pieces: list[bytes | memoryview], start: int, end: int) -> bytes:
    """Bytes `start:end` of the concatenation of `pieces`."""
    out = []
    at = 0
    for piece in pieces:
        n = len(piece)
        if at + n > start and at < end:
            out.append(piece[max(0, start - at) : end - at])
        at += n
        if at >= end:
            break
    return b"".join(out)


def delta_of(
    value_type: str, value: bytes, version: str, base_version: str, base_type: str, base: bytes
) -> BlobDelta | None:
    """`value` (the channel's blob at `version`) as a delta against `base` (its blob at
    `base_version`), or None when it is stored whole: at a version `whole_at` names,
    or when a delta would not save most of its bytes (another serde type, a shorter
    value, a change past the first `MAX_CUT` bytes of `base`, or mostly new bytes)."""
    if whole_at(version):
        return None
    n = len(base)
    overhead = len(base_version) + 32 + MAX_CUT  # the delta's fields, at most
    if value_type != base_type or len(value) < n or 2 * (len(value) - n + overhead) > len(value):
        return None
    cut = _cut(value, base)
    if cut is None:
        return None
    return BlobDelta(value_type, base_version, n, sample_crc(base), value[:cut], value[n:])


def whole_at(version: str) -> bool:
    """Whether a blob at `version` (as JSON: a counter, or a string that starts with
    one, as `EventStoreSaver.get_next_version` makes) is stored whole whatever a
    delta would save: at every power of two of the counter. A value read from the log
    then needs the deltas since the last whole one, fewer than half its versions (a
    message list's count), while the whole copies add up to about twice its last
    value: the log stays linear in the steps."""
    digits = version.strip('"').partition(".")[0]
    if not digits.isdigit() or len(digits) > 40:
        return False
    n = int(digits)
    return n > 0 and n & (n - 1) == 0


def sample_crc(data: bytes) -> int:
    """The CRC-32 of the first and the last `SAMPLE` bytes of `data` (of all of it when
    it is shorter than both)."""
    view = memoryview(data)
    if len(data) <= 2 * SAMPLE:
        return zlib.crc32(view)
    return zlib.crc32(view[-SAMPLE:], zlib.crc32(view[:SAMPLE]))


def _cut(value: bytes, base: bytes) -> int | None:
    """The smallest `c` with `value[c:len(base)] == base[c:]`, if it is within `MAX_CUT`
    bytes of their first difference there (0 when `base` is a prefix of `value`)."""
    n = len(base)
    whole = memoryview(base)  # compared in place: a blob may be megabytes
    near = min(MAX_CUT, n)
    if value.startswith(whole[:near]):
        return 0 if value.startswith(whole[near:], near) else None
    first = next(i for i in range(near) if value[i] != base[i])
    # every cut in (first, top] needs value[top:n] == base[top:]: compared once, then
    # the candidates within the window only (a value unlike its base fails at once)
    top = min(first + MAX_CUT, n)
    if not value.startswith(whole[top:], top):
        return None
    return next((c for c in range(first + 1, top + 1) if value[c:top] == base[c:top]), None)
