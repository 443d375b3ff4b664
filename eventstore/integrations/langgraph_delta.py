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

An older release does not know deltas: it reads the blob's `value`, which for a delta is
`STAND_IN`, a type no serde knows (LangGraph's raises `NotImplementedError: Unknown
serialization type`) over bytes no serde decodes (0xC1 is invalid in msgpack, in UTF-8
JSON and as a pickle opcode). It raises on reading such a channel; it never returns a
wrong value for it.
"""

# no `from __future__ import annotations`: msgspec reads these structs' annotations
# as objects, not strings to evaluate; that keeps decoder builds on cold loads ~3x cheaper

import zlib

import msgspec

__all__ = [
    "MAX_CUT",
    "SAMPLE",
    "STAND_IN_DATA",
    "STAND_IN_TYPE",
    "BlobDelta",
    "delta_of",
    "sample_crc",
]

STAND_IN_TYPE = "eventstore.delta"
STAND_IN_DATA = b"\xc1"

# how far past the first differing byte the unchanged rest may start: a msgpack array
# header is 1, 3 or 5 bytes
MAX_CUT = 16
SAMPLE = 4096


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
        if (
            base_type != self.type
            or len(base) != self.base_len
            or sample_crc(base) != self.base_crc
        ):
            return None
        return b"".join((self.head, memoryview(base)[len(self.head) :], self.tail))


def delta_of(
    value_type: str, value: bytes, base_version: str, base_type: str, base: bytes
) -> BlobDelta | None:
    """`value` as a delta against `base` (the same channel's blob at `base_version`),
    or None when that would not save most of its bytes: another serde type, a shorter
    value, a change past the first `MAX_CUT` bytes of `base`, or mostly new bytes."""
    n = len(base)
    overhead = len(base_version) + 32 + MAX_CUT  # the delta's fields, at most
    if value_type != base_type or len(value) < n or 2 * (len(value) - n + overhead) > len(value):
        return None
    cut = _cut(value, base)
    if cut is None:
        return None
    return BlobDelta(value_type, base_version, n, sample_crc(base), value[:cut], value[n:])


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
    first = next((i for i in range(near) if value[i] != base[i]), None)
    if first is None:
        return 0 if value.startswith(whole[near:], near) else None
    for c in range(first + 1, min(first + MAX_CUT, n) + 1):
        # a few bytes first: most candidates differ right away
        end = min(c + 64, n)
        if value[c:end] == base[c:end] and value.startswith(whole[end:], end):
            return c
    return None
