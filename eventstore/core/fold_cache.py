"""The persistent folded-state cache: one projection's state of one session, saved with
the head it was folded to, so a cold load folds only the lines after it.

The format (the bytes an engine keeps with `CachingEngine.store_cache`; the engine adds and
checks where in the log the head is):

    <JSON header>\n( <frame length, 4 bytes big-endian> <frame> )*<CRC-32, 8 hex>\n

The header names the format, the session, the projection and its version, the event
types the folding process could decode of those the projection reads, with the version
and upcasters it read each with (`known`, a digest: a process that skipped one of them,
or upcast old lines of one another way, folded another state), the head (`seq`, `link`,
`h`), how many frames follow and their bytes. A frame is the projection's
`encode_state` bytes (one frame), or, for a projection with `cache_frames`/
`from_cache_frame` (the transcript's), a part of its state: a cold load reads and
decodes a long state one frame at a time, so it never holds the whole cache besides the
state it builds. The checksum is a CRC-32 over everything before it (4 GB/s here, where
a SHA-256 took a third of a cold transcript load), so it binds the state to the chain
hash `h` at its position (which hashes every line before it) and to the session and
projection. It detects damage, not forgery: anyone who can write the cache can also
write a matching digest of any kind (the log's hash chain, which `verify` checks whole,
is what detects edits). A store given a cache key (`SessionStore(signing_key=...)` or
`cache_key=...`) closes its caches with an HMAC-SHA256 under that key instead (64 hex
digits): a cache forged without the key, or written unkeyed, is then ignored.

The trust rule of loads holds: every byte that went into a state this library returns
was hash-checked once. A cache is written only from states folded from checked lines (or
read from a checked cache), and a cache is used only when all of this holds, else it is
ignored (and rewritten later), never trusted:

- the engine found the head's position still in the session's live log: the same log
  (the file engine: the same lock file generation and opening snapshot, not the same
  inode, so a copy of the store keeps its caches), long enough, and the `h` of the
  line before the position is the cached `h` (`CachingEngine.open_cache`);
- the header's session, projection, version, `known`, `seq` and `h` are the ones
  expected, and every frame decodes (checked before the checksum: a state is built only
  from a cache that says it is this one, and returned only once the checksum matches);
- the checksum matches the bytes, which end right after it.
"""

from __future__ import annotations

import hashlib
import logging
import struct
import zlib
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from eventstore.engines.base import (
    BytesCacheReader,
    CacheReader,
    CachingEngine,
    Engine,
    Head,
)

if TYPE_CHECKING:
    from eventstore.signing import CacheMac

__all__ = ["FORMAT", "decode", "encode", "known_types", "load", "store"]

log = logging.getLogger("eventstore")

FORMAT = 4
"""Bump when the layout of a cache changes: caches of another format are ignored.
(1: the digest was a BLAKE2b; 2: no `known`; 3: the state unframed, a SHA-256.)"""

_CHECKSUM_HEX = 8
_MAC_HEX = 64  # the HMAC-SHA256 closing the cache of a store with a cache key
_FRAME_LEN = struct.Struct(">I")
_HEADER_MAX = 16 << 10  # a header is shorter (an id of 1,024 bytes, escaped, and ints)


class _Header(msgspec.Struct, forbid_unknown_fields=True):
    format: int
    session: str
    projection: str
    version: int
    known: str
    seq: int
    link: str
    h: str
    frames: int
    size: int  # the bytes of the frames (their lengths included)


_header_decoder = msgspec.json.Decoder(_Header)
_encoder = msgspec.json.Encoder()


def _hex(crc: int) -> bytes:
    return b"%08x" % crc


def _checksum(pieces: Iterable[bytes], mac: CacheMac | None = None) -> bytes:
    """The CRC-32 line that closes a cache made of `pieces` (in order), or with `mac` (a
    store with a cache key), their keyed MAC: a cache only the key's holder can make."""
    if mac is not None:
        return mac.digest(pieces) + b"\n"
    crc = 0
    for piece in pieces:
        crc = zlib.crc32(piece, crc)
    return _hex(crc) + b"\n"


def known_types(
    projection: Any, tags: Iterable[str], reading: Callable[[str], str] | None = None
) -> str:
    """The `known` of `projection` folded by a process that decodes the event types
    `tags`: a digest of those it reads (all of them, for a projection that reads every
    type), each as `reading(tag)` says that process reads it (`EventCodec.reading`: its
    version and upcasters; a process whose upcasters differ folds another state)."""
    wanted = projection.event_types
    mine = sorted(set(tags) if wanted is None else set(tags) & set(wanted))
    if reading is not None:
        mine = [reading(t) for t in mine]
    return hashlib.sha256("\n".join(mine).encode("utf-8", "surrogatepass")).hexdigest()[:16]


def is_framed(projection: Any) -> bool:
    """Whether `projection` keeps its state in frames (`cache_frames`, `from_cache_frame`)."""
    return (
        getattr(projection, "cache_frames", None) is not None
        and getattr(projection, "from_cache_frame", None) is not None
    )


def encode(
    session_id: str,
    projection: Any,
    state: Any,
    head: Head,
    known: str,
    mac: CacheMac | None = None,
) -> list[bytes]:
    """The cache bytes of `state`, folded to `head` by a process whose `known_types` for
    `projection` are `known`, for `session_id`, in pieces (a transcript's megabytes are
    never joined into one more copy: its writer writes them in turn)."""
    frames: list[bytes] = (
        projection.cache_frames(state)
        if is_framed(projection)
        else [projection.encode_state(state)]
    )
    parts = []
    for frame in frames:
        parts.append(_FRAME_LEN.pack(len(frame)))
        parts.append(frame)
    size = sum(map(len, parts))
    header = _Header(
        FORMAT,
        session_id,
        projection.name,
        projection.version,
        known,
        head.seq,
        head.link,
        head.h,
        len(frames),
        size,
    )
    pieces = [_encoder.encode(header) + b"\n", *parts]
    pieces.append(_checksum(pieces, mac))
    return pieces


def decode(
    data: bytes,
    session_id: str,
    projection: Any,
    head: Head,
    known: str,
    mac: CacheMac | None = None,
) -> Any | None:
    """The state a cache holds, if it is intact and is this session's and projection's
    state at `head` (by seq and `h`), folded knowing the event types `known` says, and
    with `mac`, its MAC is that key's; else None (and why, at debug level)."""
    return _read(BytesCacheReader(data), session_id, projection, head, known, mac)


def _read(
    reader: CacheReader,
    session_id: str,
    projection: Any,
    head: Head,
    known: str,
    mac: CacheMac | None,
) -> Any | None:
    why = _check(reader, session_id, projection, head, known, mac)
    if isinstance(why, str):
        log.debug("eventstore: fold cache of %r/%s ignored: %s", session_id, projection.name, why)
        return None
    return why[0]


class _Stream:
    """The bytes of a cache after its header line: what the header read took of them
    first, then the reader's."""

    __slots__ = ("left", "pending", "reader")

    def __init__(self, reader: CacheReader, pending: bytes, left: int) -> None:
        self.reader = reader
        self.pending = pending
        self.left = left  # bytes not yet taken (by the reader's size)

    def take(self, n: int) -> bytes | None:
        """The next `n` bytes, None when fewer are left (a cache cut short)."""
        if n > self.left:
            return None
        if self.pending:
            part, self.pending = self.pending[:n], self.pending[n:]
            if len(part) < n:
                part += self.reader.read(n - len(part))
        else:
            part = self.reader.read(n)
        self.left -= n
        return part if len(part) == n else None


class _Crc:
    """The unkeyed checksum being computed, shaped as `RunningMac`."""

    __slots__ = ("crc",)

    def __init__(self) -> None:
        self.crc = 0

    def update(self, data: bytes) -> None:
        self.crc = zlib.crc32(data, self.crc)

    def hexdigest(self) -> bytes:
        return _hex(self.crc)


def _check(
    reader: CacheReader,
    session_id: str,
    projection: Any,
    head: Head,
    known: str,
    mac: CacheMac | None,
) -> str | tuple[Any]:
    size = reader.size
    width = _MAC_HEX if mac is not None else _CHECKSUM_HEX
    if size < width + 2:
        return "too short"
    first = reader.read(min(size, _HEADER_MAX))
    nl = first.find(b"\n")
    if nl < 0:
        return "malformed"
    try:
        header = _header_decoder.decode(first[:nl])
    except msgspec.MsgspecError:
        return "the header does not decode"
    if header.format != FORMAT:
        return f"format {header.format}, this code reads {FORMAT}"
    if header.session != session_id or header.projection != projection.name:
        return f"it is {header.session!r}/{header.projection}'s"
    if header.version != projection.version:
        return f"projection version {header.version}, this code folds {projection.version}"
    if header.known != known:
        return "it was folded by a process that decodes other event types"
    if header.seq != head.seq or header.h != head.h or header.link != head.link:
        return "its head is not the head the engine found"
    framed = is_framed(projection)
    if header.frames < 0 or (not framed and header.frames != 1):
        return f"{header.frames} frames"
    if header.size != size - nl - 1 - width - 1 or header.size < 4 * header.frames:
        # (a file made of a genuine header and more, or other, frames than it wrote; or a
        # cache written with a key other than this store's, or without one)
        return f"{size} bytes, where the header makes it {nl + 1 + header.size + width + 1}"
    crc = mac.start() if mac is not None else _Crc()
    crc.update(first[: nl + 1])
    stream = _Stream(reader, first[nl + 1 :], header.size)
    state = projection.initial() if framed else None
    for _ in range(header.frames):
        length = stream.take(_FRAME_LEN.size)
        if length is None:
            return "cut short"
        frame = stream.take(_FRAME_LEN.unpack(length)[0])
        if frame is None:
            return "cut short"
        crc.update(length)
        crc.update(frame)
        # the state is returned only once the checksum is the cache's: a frame that
        # decodes from damaged bytes is never kept
        try:
            state = (
                projection.from_cache_frame(state, frame)
                if framed
                else projection.decode_state(frame)
            )
        except Exception as exc:  # noqa: BLE001 - whatever a projection's decoding raises
            return f"the state does not decode: {exc!r}"
    if stream.left != 0:
        return "bytes after the last frame"
    stream.left = width + 1
    if stream.take(width + 1) != crc.hexdigest() + b"\n":
        return "the checksum does not match" if mac is None else "the MAC does not match"
    return (state,)


class CacheCrypt(Protocol):
    """Seals and opens the caches of a store with keys (`eventstore.core.keys.CacheCipher`)."""

    def encrypt(
        self, session_id: str, name: str, head: Head, pieces: list[bytes]
    ) -> list[bytes] | None:
        """`pieces` sealed, or None: keep no cache."""
        ...

    def decrypt(self, session_id: str, name: str, head: Head, data: bytes) -> bytes | None:
        """The cache's bytes, or None: do not use it."""
        ...


def load(
    engine: Engine,
    session_id: str,
    projection: Any,
    known: str,
    mac: CacheMac | None = None,
    crypt: CacheCrypt | None = None,
) -> tuple[Any, Head] | None:
    """The cached state and its head, when the engine keeps a cache that checks (with
    `mac`: one that carries this key's MAC; with a `crypt`: one that opens)."""
    if not isinstance(engine, CachingEngine):
        return None
    found = engine.open_cache(session_id, projection.name)
    if found is None:
        return None
    head, reader = found
    if crypt is not None:
        with reader:
            plain = crypt.decrypt(session_id, projection.name, head, reader.read(reader.size))
        if plain is None:
            return None
        reader = BytesCacheReader(plain)
    with reader:
        state = _read(reader, session_id, projection, head, known, mac)
    return None if state is None else (state, head)


def store(
    engine: Engine,
    session_id: str,
    projection: Any,
    state: Any,
    head: Head,
    known: str,
    mac: CacheMac | None = None,
    crypt: CacheCrypt | None = None,
) -> int:
    """Keep `state` (folded to `head`) for the next cold load, and say how many bytes
    that took (0: nothing kept); best effort: a failure is logged, never raised (the log
    is the truth, the cache only saves time)."""
    if head.seq == 0 or head.position is None or not isinstance(engine, CachingEngine):
        return 0
    try:
        pieces: list[bytes] | None = encode(session_id, projection, state, head, known, mac)
        if crypt is not None and pieces is not None:
            pieces = crypt.encrypt(session_id, projection.name, head, pieces)
        if pieces is None:
            return 0
        engine.store_cache(session_id, projection.name, head, pieces)
    except Exception as exc:  # noqa: BLE001 - a cache must never fail what called it
        log.warning("eventstore: saving the fold cache of %r failed: %s", session_id, exc)
        return 0
    return sum(map(len, pieces))
