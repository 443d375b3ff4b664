"""The line level of the reader: a log's bytes split into lines, each line decoded and
its hash link checked on its own.

What a line is, whatever stands around it: a decodable event (exactly: an old version
upcast, an unknown type kept verbatim; see `EventCodec.decode_line`), closed by its `h`,
which chains it to the link of the line before (`eventstore.format.chain`). Whether the
lines make whole batches with contiguous sequence numbers, and where a snapshot may
stand, is the batch level's question (`eventstore.format.reader`), which also decides
what a problem found here does.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from operator import attrgetter

import msgspec

from eventstore.errors import CorruptLogError
from eventstore.format.chain import (
    hash_checks,
    line_hash,
    split_hash,
)
from eventstore.format.codec import EventCodec, LineDecoder
from eventstore.format.events import Event, Snapshot

__all__ = [
    "CheckedLine",
    "chain_checks",
    "check_line",
    "decode_exactly",
    "envelope_guess",
    "split_lines",
]

_blake2b = hashlib.blake2b
_get_h = attrgetter("h")
_dict_decoder = msgspec.json.Decoder(dict[str, object])


def split_lines(buf: bytes) -> Iterator[tuple[int, bytes, bool]]:
    """Each line of `buf`: its offset in `buf`, its bytes (without the newline), and
    whether it is complete (False only for bytes after the last newline)."""
    pos, n = 0, len(buf)
    while pos < n:
        nl = buf.find(b"\n", pos)
        if nl < 0:
            yield pos, buf[pos:], False
            return
        yield pos, buf[pos:nl], True
        pos = nl + 1


class CheckedLine(msgspec.Struct):
    """One line as the line level read it.

    `event`: what it decodes to, or None, and then `error` says why not. `h`: its hash
    field, None when the line does not end with one (malformed). `expected_h`: what the
    line hashes to from the link before it, when that is not its `h` (None: it checks,
    or cannot be checked). `link`: what the next line chains to (None: unknown).
    """

    event: Event | None
    error: CorruptLogError | None
    h: str | None
    expected_h: str | None
    link: str | None


def check_line(
    codec: EventCodec,
    decoder: LineDecoder,
    line: bytes,
    at: int,
    where: str,
    link: str | None,
) -> CheckedLine:
    """Decode `line` (no newline; at byte `at` of the log named `where`) and check its
    hash against `link`, the link of the line before (None: unknown, not checked). A
    snapshot chains to its own `base_h`; a line that does not decode passes on the link
    it claims, so reading can go on after it."""
    decoded = decode_exactly(codec, decoder, line, at, where)
    sh = split_hash(line)
    h = None if sh is None else sh[1]
    if isinstance(decoded, CorruptLogError):
        return CheckedLine(None, decoded, h, None, h)
    is_snapshot = type(decoded) is Snapshot
    if is_snapshot:
        link = decoded.base_h  # type: ignore[attr-defined]
    expected = None
    if sh is not None and link is not None:
        expect = line_hash(link, sh[0])
        if expect != sh[1]:
            expected = expect
    # an unknown event's link is its h, like every line's but a snapshot's
    nxt = None if sh is None else link if is_snapshot else sh[1]
    return CheckedLine(decoded, None, h, expected, nxt)


def decode_exactly(
    codec: EventCodec, decoder: LineDecoder, line: bytes, at: int, where: str
) -> Event | CorruptLogError:
    """One line, exactly (an old version upcast, an unknown type kept verbatim), or the
    error saying why it does not decode."""
    try:
        try:
            ev = decoder.decode_lines(line + b"\n")[0]
        except (msgspec.DecodeError, msgspec.ValidationError, IndexError, RecursionError):
            return codec.decode_line(line, at, where)  # (which says what is wrong)
        if ev.v != type(ev).VERSION and not type(ev).SKIPPED:
            return codec.decode_line(line, at, where)
        return ev
    except CorruptLogError as exc:
        return exc


def envelope_guess(line: bytes, want: int | None) -> tuple[int | None, int]:
    """The seq and `more` an unreadable line claims, so reading can go on after it."""
    try:
        data = _dict_decoder.decode(line)
    except (msgspec.DecodeError, RecursionError):
        return want, 0
    s = data.get("seq")
    m = data.get("more", 0)
    return (s if isinstance(s, int) else want), (m if isinstance(m, int) else 0)


def chain_checks(lines: list[bytes], events: list[Event], first: int, link: str) -> bool:
    """Whether every line ends with its `h` and each `h` chains its line to the one
    before: h = blake2b(link of the line before + the line up to `,"h":"` + "}"). An
    opening snapshot (`first`) chains to its own base_h, and so does the line after it.
    The fast path's check of many lines at once; `check_line` checks one and says more."""
    hs = list(map(_get_h, events))
    if first:
        prev = events[0].base_h.encode()  # type: ignore[attr-defined]
        if not hash_checks(prev, lines[0], hs[0]):
            return False
    else:
        prev = link.encode()
    for line, h in zip(lines[first:], hs[first:], strict=True):
        # inlined hash_checks: this loop is the cost of checking on every load
        if line[-24:-18] != b',"h":"':
            return False
        digest = _blake2b(prev, digest_size=8)
        digest.update(memoryview(line)[:-24])  # the body, not copied
        digest.update(b"}")
        if digest.hexdigest() != h:
            return False
        prev = line[-18:-2]
    return True
