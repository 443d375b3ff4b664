"""The hash chain, and the fixed byte shapes of a line that readers rely on.

Every line is closed by its hash field, the line's last one:

    {"type":"progress_appended","seq":7,"ts":"2026-11-29T15:40:00.123456Z","entry":{...},"h":"9f2c..."}

`h` is the first 16 hex digits of BLAKE2b over the link of the previous line followed by
the line's own bytes up to (not including) `,"h":`, closed by `}`. The link of a line is
its `h`, except for a snapshot, whose link is `base_h` (the `h` of the last line it
replaces), so lines copied verbatim after a snapshot still chain. The codec appends `h`
as the last field (`HASH_SUFFIX_LEN` bytes close every line), which lets a reader check
a line without re-encoding it.

A snapshot line opens with `SNAPSHOT_OPEN`, and its header (envelope, `length`, `layout`)
comes before `STATES_OPEN`: a reader finds one projection's state by the layout without
decoding the rest of the line (`find_snapshot_head`, `states_end`, `locate_states`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import msgspec

from eventstore.format.events import (
    Event,
    Snapshot,
    SnapshotHead,
)

__all__ = [
    "HASH_SUFFIX_LEN",
    "LINE_END_LEN",
    "SNAPSHOT_OPEN",
    "STATES_OPEN",
    "chains_to",
    "damaged_newline",
    "find_snapshot_head",
    "hash_checks",
    "line_hash",
    "link_at",
    "link_before",
    "link_ending",
    "link_of",
    "locate_states",
    "split_hash",
    "states_end",
]

HASH_SUFFIX_LEN = len(b',"h":"') + 16 + len(b'"}')  # 24 bytes closing every line
LINE_END_LEN = HASH_SUFFIX_LEN + 1  # and its newline
SNAPSHOT_OPEN = b'{"type":"snapshot",'
"""How a snapshot line starts (its envelope's first field)."""
STATES_OPEN = b',"states":{'
"""What ends a snapshot line's header: the fields before it are a `SnapshotHead`."""

_blake2b = hashlib.blake2b
_json_encoder = msgspec.json.Encoder()
_snapshot_head_decoder = msgspec.json.Decoder(SnapshotHead)


def line_hash(link: str, body: bytes) -> str:
    """The 16-hex-digit hash of a line body chained to the previous line's link."""
    return _blake2b(link.encode() + body, digest_size=8).hexdigest()


def hash_checks(link: bytes, line: bytes | memoryview, h: str) -> bool:
    """Whether `line` (no newline) ends with its `h` field and `h` chains it to `link`:
    the `line_hash` of its body, hashed in place (a long snapshot line is not copied)."""
    if line[-HASH_SUFFIX_LEN:-18] != b',"h":"':
        return False
    digest = _blake2b(link, digest_size=8)
    digest.update(memoryview(line)[:-HASH_SUFFIX_LEN])
    digest.update(b"}")
    return digest.hexdigest() == h


def chains_to(link: str, line: bytes | memoryview) -> bool:
    """Whether `line` (no newline) ends with the `h` that chains it to `link`."""
    return hash_checks(link.encode(), line, bytes(line[-18:-2]).decode("ascii", "replace"))


def link_ending(end: bytes) -> str | None:
    """The `h` a line ends with, told from its last `LINE_END_LEN` bytes (`end`, its
    newline included); None when they do not end a line."""
    if len(end) != LINE_END_LEN or end[:6] != b',"h":"' or end[22:] != b'"}\n':
        return None
    try:
        return end[6:22].decode("ascii")
    except UnicodeDecodeError:
        return None


def link_at(read_span: Callable[[int, int], bytes], offset: int) -> str | None:
    """The link the line at byte `offset` of a log chains to, the line before it being
    a plain line: "" at the log's start, else the `h` ending that line (its last
    `LINE_END_LEN` bytes, `read_span(start, end)`); None when they end no line."""
    if offset == 0:
        return ""
    if offset < LINE_END_LEN:
        return None
    return link_ending(read_span(offset - LINE_END_LEN, offset))


def link_before(before: bytes) -> str | None:
    """The link a line chains to, told from the last `LINE_END_LEN` bytes of the line
    before it (`before`, as a `SeqEngine` reads them; b"" before a log's first line,
    which chains to ""); None when they end no line."""
    return link_ending(before) if before else ""


def link_of(event: Event) -> str:
    """The value the next line chains to (see the module docstring)."""
    return event.base_h if isinstance(event, Snapshot) else event.h


def split_hash(line: bytes) -> tuple[bytes, str] | None:
    """Split a line (no newline) into the hashed body and its `h`; None if malformed."""
    if len(line) <= HASH_SUFFIX_LEN or not line.endswith(b'"}'):
        return None
    if line[-HASH_SUFFIX_LEN : -HASH_SUFFIX_LEN + 6] != b',"h":"':
        return None
    h = line[-18:-2]
    try:
        text = h.decode("ascii")
    except UnicodeDecodeError:
        return None
    return line[:-HASH_SUFFIX_LEN] + b"}", text


def damaged_newline(tail: bytes, link: str) -> bool:
    """Whether `tail`, the bytes after a log's last newline, is a whole line chained to
    `link` whose newline was replaced by another byte.

    A crash mid-append leaves a prefix of the bytes it meant to write, so its partial
    line never ends in a byte that is not the newline after a complete line whose `h`
    checks: such a tail is a committed line that was damaged, not a torn one.
    """
    if len(tail) <= HASH_SUFFIX_LEN or tail[-1:] == b"\n":
        return False
    sh = split_hash(tail[:-1])
    return sh is not None and line_hash(link, sh[0]) == sh[1]


def find_snapshot_head(read_prefix: Callable[[int], bytes]) -> tuple[SnapshotHead, bytes] | None:
    """The header of the snapshot that opens a log, and its bytes (those before
    `STATES_OPEN`), read through `read_prefix(n)`: the log's first `n` bytes (fewer at
    its end). None when the log does not open with a snapshot whose header decodes."""
    n = 4096
    while True:
        buf = read_prefix(n)
        if not buf.startswith(SNAPSHOT_OPEN):
            return None
        i = buf.find(STATES_OPEN)
        if i >= 0:
            try:
                return _snapshot_head_decoder.decode(buf[:i] + b"}"), buf[:i]
            except (msgspec.DecodeError, msgspec.ValidationError):
                return None
        if len(buf) < n:
            return None
        n *= 4


def states_end(line: bytes | memoryview, head: SnapshotHead, start: int) -> int | None:
    """Where the states object of a snapshot line ends (the index of its `}`), when the
    line's `layout` describes it exactly: from `start` (just after `STATES_OPEN`), each
    state's key then its entry at the range the layout gives, in order, separated by
    commas, and nothing else. None for any other shape (the caller decodes the whole
    line instead). Checks the shape only: the line's hash vouches for the bytes."""
    pos = start
    names = list(head.layout)
    for i, name in enumerate(names):
        a, b = head.layout[name]
        key = _json_encoder.encode(name) + b":"
        if a != pos + len(key) or b <= a or b >= len(line) or line[pos:a] != key:
            return None
        pos = b
        if line[pos] != (0x2C if i + 1 < len(names) else 0x7D):  # "," or "}"
            return None
        pos += 1
    return pos - 1 if names else None


def locate_states(line: bytes, states: dict[str, msgspec.Raw]) -> dict[str, tuple[int, int]]:
    """The byte range of each state's entry in a snapshot line encoded from `states`:
    what its `layout` says (`EventCodec.encode_snapshot` iterates until they agree)."""
    # msgspec writes a dict[str, Raw] as {"name":raw,...} with no spaces, in order
    # (states_end checks a line against what this finds)
    pos = line.index(STATES_OPEN) + len(STATES_OPEN)
    found: dict[str, tuple[int, int]] = {}
    for name, raw in states.items():
        key = _json_encoder.encode(name) + b":"
        assert line[pos : pos + len(key)] == key
        start = pos + len(key)
        found[name] = (start, start + len(raw))
        pos = start + len(raw) + 1
    return found
