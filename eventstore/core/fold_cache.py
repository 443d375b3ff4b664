"""The persistent folded-state cache: one projection's state of one session, saved with
the head it was folded to, so a cold load folds only the lines after it.

The format (the bytes an engine keeps with `CachingEngine.store_cache`; the engine adds and
checks where in the log the head is):

    <JSON header>\n[<chunk list, JSON>\n]( <frame length, 4 bytes big-endian> <frame> )*
    <CRC-32, 8 hex>\n

The header names the format, the session, the projection and its version, the part (-1:
the projection's own cache; k: its chunk k, below), the event types the folding process
could decode of those the projection reads, with the version and upcasters it read each
with (`known`, a digest: a process that skipped one of them, or upcast old lines of one
another way, folded another state), the head (`seq`, `link`, `h`), how many chunks it
lists and the bytes of their list, how many frames follow and their bytes. A frame is
the projection's `encode_cache` bytes, else its `encode_state` bytes (one frame), or,
for a projection with `cache_frames`/`from_cache_frame` (the transcript's), a part of
its state: a cold load reads and decodes a long state one frame at a time, so it never
holds the whole cache besides the state it builds. The checksum is a CRC-32 over
everything before it (4 GB/s here, where a SHA-256 took a third of a cold transcript
load), so it binds the state to the chain hash `h` at its position (which hashes every
line before it) and to the session and projection. It detects damage, not forgery:
anyone who can write the cache can also write a matching digest of any kind (the log's
hash chain, which `verify` checks whole, is what detects edits). A store given a cache
key (`SessionStore(signing_key=...)` or `cache_key=...`) closes its caches with an
HMAC-SHA256 under that key instead (64 hex digits): a cache forged without the key, or
written unkeyed, is then ignored.

Chunks. On an engine that keeps cache parts (`CachingEngine.keeps_cache_parts`), a
projection with `cache_frames_from` (the transcript's) keeps each complete frame as a
cache of its own, chunk k, named `<projection>#k`: this format, holding that one frame,
written once (after the append that completes it: `store_complete_frames`) at the head
its state was folded to then. The projection's own cache lists its chunks, each as that
head (`seq`, `link`, `h`) and its checksum line, and holds the frames after them: a
close writes only the last, partial frame and the list. Chunks are of one state object
(`Chunks.of`): a state replaced (a snapshot folded, a reset, a refold) starts with none.
A chunk is never written over one that another cache may list: a writer that finds chunk
k kept already as it would write it (the same frame, at a head the engine finds in the
live log) lists that one, and one kept at a head past its own it leaves alone, keeping
the frames from there in its own cache (`_chunk_kept`: two writers that folded the log
without a cache, closing at once, would otherwise each replace the other's chunks and
leave a cache that lists one it no longer has); a compaction still removes the chunks
after it that are not its state's (`_kept_from`).

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
- the checksum matches the bytes, which end right after it;
- every chunk it lists passes the same checks at its own head, is the part listed, was
  written at the listed head (not past the cache's own) and carries the listed checksum
  (with a cache key: its MAC). One that is missing, another writer's, of another
  history, damaged or forged makes the whole cache ignored, never used in part. The
  engine does not check a chunk's head against the live log again
  (`CachingEngine.open_cache_parts`): the cache that lists it passed that check, so the
  listed head, whose `h` hashes every line before it, is a point of the live log, and a
  chunk is used only at that head with the listed checksum over its bytes.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Literal, Protocol

import msgspec

from eventstore.engines.base import (
    BytesCacheReader,
    CacheReader,
    CachingEngine,
    Engine,
    Head,
    ReadResult,
    cache_part_name,
)
from eventstore.logger import log

if TYPE_CHECKING:
    from eventstore.signing import CacheMac

__all__ = [
    "FORMAT",
    "Chunks",
    "chunks_kept",
    "chunks_of",
    "decode",
    "encode",
    "is_chunked",
    "known_types",
    "load",
    "load_opened",
    "store",
    "store_complete_frames",
]


FORMAT = 5
"""Bump when the layout of a cache changes: caches of another format are ignored.
(1: the digest was a BLAKE2b; 2: no `known`; 3: the state unframed, a SHA-256; 4: no
chunks, every frame in the one cache.)"""

_CHECKSUM_HEX = 8
_MAC_HEX = 64  # the HMAC-SHA256 closing the cache of a store with a cache key
_FRAME_LEN = struct.Struct(">I")
_HEADER_MAX = 16 << 10  # a header is shorter (an id of 1,024 bytes, escaped, and ints)
_WHOLE = -1  # the `part` of a projection's own cache (a chunk's is its frame index)


class _Header(msgspec.Struct, forbid_unknown_fields=True):
    format: int
    session: str
    projection: str
    part: int  # -1: the projection's own cache; k >= 0: chunk k (frame k alone)
    version: int
    known: str
    seq: int
    link: str
    h: str
    chunks: int  # chunk caches holding the frames before this cache's own
    listing: int  # the bytes of their list (its newline included; 0 without chunks)
    frames: int
    size: int  # the bytes of the frames (their lengths included)


ChunkRef = tuple[int, str, str, str]
"""A chunk cache as a projection's own cache lists it: the head it was written at (seq,
link, h) and its checksum line (the CRC-32, or the MAC, without the newline)."""

_header_decoder = msgspec.json.Decoder(_Header)
_listing_decoder = msgspec.json.Decoder(list[ChunkRef])
_encoder = msgspec.json.Encoder()


class Chunks:
    """The chunk caches holding the complete frames of one state object, as this
    process wrote or read them (`store`, `load`). They stand for `state`'s first
    `len(refs)` frames only while `state` is the very object (`of`): a projection with
    `cache_frames_from` only appends to a state it folds forward, and a state replaced
    (a snapshot folded, a reset, a refold) is another object. `sealed_out`: the store's
    cipher kept no cache of this session (a plain session of a store with keys): not
    tried again on every append. `looked`: the log's size when a writer last looked for
    the next complete frame (far below any size: never; see `CachePolicy.after_write`)."""

    __slots__ = ("looked", "refs", "sealed_out", "state")

    def __init__(self, state: Any, refs: list[ChunkRef] | None = None) -> None:
        self.state = state
        self.refs: list[ChunkRef] = [] if refs is None else refs
        self.sealed_out = False
        self.looked = -(1 << 62)

    def of(self, state: Any) -> bool:
        """Whether these are chunks of `state` (the same object)."""
        return self.state is state


def chunks_of(chunks: Chunks | None, state: Any) -> Chunks:
    """`chunks` if they are of `state` (the same object), else none yet of it."""
    return chunks if chunks is not None and chunks.of(state) else Chunks(state)


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


def _encoded(projection: Any, state: Any) -> bytes:
    """The one frame of an unframed state: `encode_cache`'s bytes, else `encode_state`'s."""
    encode = getattr(projection, "encode_cache", None)
    return projection.encode_state(state) if encode is None else encode(state)  # type: ignore[no-any-return]


def _decoded(projection: Any, frame: bytes) -> Any:
    """The state in `_encoded`'s frame."""
    decode = getattr(projection, "decode_cache", None)
    return projection.decode_state(frame) if decode is None else decode(frame)


def is_chunked(projection: Any) -> bool:
    """Whether `projection`'s complete frames are kept as chunk caches: it is framed and
    says which of its frames are complete (`cache_frames_from`)."""
    return is_framed(projection) and getattr(projection, "cache_frames_from", None) is not None


def chunks_kept(engine: Engine, projection: Any) -> bool:
    """Whether `projection`'s cache on `engine` is kept in chunks (the engine can remove
    the chunks a shorter state leaves behind: `CachingEngine.keeps_cache_parts`)."""
    return getattr(engine, "keeps_cache_parts", False) is True and is_chunked(projection)


def _pieces(
    session_id: str,
    projection: Any,
    part: int,
    frames: list[bytes],
    head: Head,
    known: str,
    mac: CacheMac | None,
    refs: list[ChunkRef] | tuple[()] = (),
) -> list[bytes]:
    """The bytes of one cache (the projection's own, or chunk `part`), in pieces."""
    parts = []
    for frame in frames:
        parts.append(_FRAME_LEN.pack(len(frame)))
        parts.append(frame)
    listing = _encoder.encode(refs) + b"\n" if refs else b""
    header = _Header(
        FORMAT,
        session_id,
        projection.name,
        part,
        projection.version,
        known,
        head.seq,
        head.link,
        head.h,
        len(refs),
        len(listing),
        len(frames),
        sum(map(len, parts)),
    )
    pieces = [_encoder.encode(header) + b"\n"]
    if listing:
        pieces.append(listing)
    pieces += parts
    pieces.append(_checksum(pieces, mac))
    return pieces


def encode(
    session_id: str,
    projection: Any,
    state: Any,
    head: Head,
    known: str,
    mac: CacheMac | None = None,
) -> list[bytes]:
    """The cache bytes of `state` whole (no chunks), folded to `head` by a process whose
    `known_types` for `projection` are `known`, for `session_id`, in pieces (a
    transcript's megabytes are never joined into one more copy: its writer writes them
    in turn)."""
    frames: list[bytes] = (
        projection.cache_frames(state) if is_framed(projection) else [_encoded(projection, state)]
    )
    return _pieces(session_id, projection, _WHOLE, frames, head, known, mac)


def decode(
    data: bytes,
    session_id: str,
    projection: Any,
    head: Head,
    known: str,
    mac: CacheMac | None = None,
) -> Any | None:
    """The state a whole cache (one listing no chunks) holds, if it is intact and is this
    session's and projection's state at `head` (by seq and `h`), folded knowing the event
    types `known` says, and with `mac`, its MAC is that key's; else None (and why, at
    debug level)."""
    found = _read(BytesCacheReader(data), _Want(session_id, projection, head, known, mac), None)
    return None if found is None else found[0]


class _Want:
    """What a cache must be to be used: whose, at which head, folded knowing what, closed
    with which MAC; `part`: the projection's own cache, or chunk k."""

    __slots__ = ("head", "known", "mac", "part", "projection", "session_id")

    def __init__(
        self,
        session_id: str,
        projection: Any,
        head: Head,
        known: str,
        mac: CacheMac | None,
        part: int = _WHOLE,
    ) -> None:
        self.session_id = session_id
        self.projection = projection
        self.head = head
        self.known = known
        self.mac = mac
        self.part = part

    def chunk(self, part: int, head: Head | None = None) -> _Want:
        """The same for chunk `part` (at `head`, where given)."""
        return _Want(
            self.session_id,
            self.projection,
            self.head if head is None else head,
            self.known,
            self.mac,
            part,
        )


# opens the chunks listed (in order) and folds their frames into the state: the state,
# or why not
ChunkOpener = Callable[[list[ChunkRef], Any], Any]


def _read(
    reader: CacheReader, want: _Want, open_chunk: ChunkOpener | None, state: Any = None
) -> tuple[Any, list[ChunkRef]] | None:
    why = _check(reader, want, open_chunk, state)
    if isinstance(why, str):
        log.debug(
            "eventstore: fold cache of %r/%s ignored: %s",
            want.session_id, want.projection.name, why,
        )  # fmt: skip
        return None
    return why[0], why[2]


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


def _header_of(first: bytes, want: _Want) -> tuple[_Header, int] | str:
    """The header line at the start of `first` and its length, if it is the cache
    `want` asks for; else why not."""
    nl = first.find(b"\n")
    if nl < 0:
        return "malformed"
    try:
        header = _header_decoder.decode(first[:nl])
    except msgspec.MsgspecError:
        return "the header does not decode"
    projection = want.projection
    if header.format != FORMAT:
        return f"format {header.format}, this code reads {FORMAT}"
    if header.session != want.session_id or header.projection != projection.name:
        return f"it is {header.session!r}/{header.projection}'s"
    if header.part != want.part:
        return f"it is part {header.part} of the cache, not part {want.part}"
    if header.version != projection.version:
        return f"projection version {header.version}, this code folds {projection.version}"
    if header.known != want.known:
        return "it was folded by a process that decodes other event types"
    head = want.head
    if header.seq != head.seq or header.h != head.h or header.link != head.link:
        return "its head is not the head the engine found"
    return header, nl


def _check(
    reader: CacheReader, want: _Want, open_chunk: ChunkOpener | None, state: Any
) -> str | tuple[Any, bytes, list[ChunkRef]]:
    """The state the cache holds (folded into `state` for a chunk), its checksum line
    and the chunks it lists; or why it is not used."""
    size = reader.size
    width = _MAC_HEX if want.mac is not None else _CHECKSUM_HEX
    if size < width + 2:
        return "too short"
    first = reader.read(min(size, _HEADER_MAX))
    found = _header_of(first, want)
    if isinstance(found, str):
        return found
    header, nl = found
    projection = want.projection
    framed = is_framed(projection)
    if header.frames < 0 or (header.frames != 1 and (not framed or want.part != _WHOLE)):
        return f"{header.frames} frames"
    if header.chunks < 0 or (header.chunks and open_chunk is None) or (
        header.chunks == 0) != (header.listing == 0):  # fmt: skip
        return f"{header.chunks} chunks where this cache may list none"
    body = header.listing + header.size
    if body != size - nl - 1 - width - 1 or header.size < 4 * header.frames:
        # (a file made of a genuine header and more, or other, frames than it wrote; or a
        # cache written with a key other than this store's, or without one)
        return f"{size} bytes, where the header makes it {nl + 1 + body + width + 1}"
    crc = want.mac.start() if want.mac is not None else _Crc()
    crc.update(first[: nl + 1])
    stream = _Stream(reader, first[nl + 1 :], body)
    if want.part == _WHOLE:
        state = projection.initial() if framed else None
    refs: list[ChunkRef] = []
    if header.chunks:
        assert open_chunk is not None
        listing = stream.take(header.listing)
        if listing is None:
            return "cut short"
        crc.update(listing)
        try:
            refs = _listing_decoder.decode(listing)
        except msgspec.MsgspecError:
            return "the list of chunks does not decode"
        if len(refs) != header.chunks:
            return f"{len(refs)} chunks listed, where the header says {header.chunks}"
        # a chunk's frame is kept only once this cache's checksum below is the cache's
        state = open_chunk(refs, state)
        if isinstance(state, str):
            return state
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
                projection.from_cache_frame(state, frame) if framed else _decoded(projection, frame)
            )
        except Exception as exc:  # noqa: BLE001 - whatever a projection's decoding raises
            return f"the state does not decode: {exc!r}"
    if stream.left != 0:
        return "bytes after the last frame"
    stream.left = width + 1
    digest = crc.hexdigest()
    if stream.take(width + 1) != digest + b"\n":
        return "the checksum does not match" if want.mac is None else "the MAC does not match"
    return state, digest, refs


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


def _opened(
    found: tuple[Head, CacheReader] | None,
    session_id: str,
    name: str,
    crypt: CacheCrypt | None,
) -> tuple[Head, CacheReader] | None:
    """The cache `name` the engine opened (`found`), opened with `crypt` if given."""
    if found is None or crypt is None:
        return found
    head, reader = found
    with reader:
        plain = crypt.decrypt(session_id, name, head, reader.read(reader.size))
    if plain is None:
        return None
    opened = BytesCacheReader(plain)
    opened.read_on = reader.read_on
    return head, opened


def _chunk_opener(engine: CachingEngine, want: _Want, crypt: CacheCrypt | None) -> ChunkOpener:
    """Opens the chunks a projection's own cache (`want`) lists: each must be kept, at
    the listed head (never past the cache's own), and carry the listed checksum."""
    name = want.projection.name

    def open_chunks(refs: list[ChunkRef], state: Any) -> Any:
        for k, ref in enumerate(refs):
            if ref[0] > want.head.seq:
                return f"chunk {k}: listed past the cache's head"
        # opened without the engine's live-log check (`open_cache_parts`): the cache
        # listing them passed it, so each chunk's listed (seq, link, h) is a point of the
        # live log, and a chunk is used only with those and the listed checksum
        parts: Iterator[tuple[Head, CacheReader] | None] = engine.open_cache_parts(
            want.session_id, name, len(refs)
        )
        for k, ref in enumerate(refs):
            found = _opened(next(parts, None), want.session_id, cache_part_name(name, k), crypt)
            state = _fold_chunk(want, k, ref, found, state)
            if isinstance(state, str):
                return f"chunk {k}: {state}"
        return state

    return open_chunks


def _fold_chunk(
    want: _Want, k: int, ref: ChunkRef, found: tuple[Head, CacheReader] | None, state: Any
) -> Any:
    """`state` with the frame of chunk `k` (`found`, listed as `ref` by the cache
    `want`) folded in, or why not."""
    if found is None:
        return "missing"
    head, reader = found
    seq, link, h, digest = ref
    with reader:
        if (head.seq, head.link, head.h) != (seq, link, h):
            return "at another head than listed"
        got = _check(reader, want.chunk(k, head), None, state)
    if isinstance(got, str):
        return got
    if got[1] != digest.encode("ascii", "replace"):
        return "another checksum than listed"
    return got[0]


def load(
    engine: Engine,
    session_id: str,
    projection: Any,
    known: str,
    mac: CacheMac | None = None,
    crypt: CacheCrypt | None = None,
) -> tuple[Any, Head, Chunks | None, ReadResult | None] | None:
    """The cached state, its head, the chunks it was read from (None for a projection
    not kept in chunks) and the log after it if the engine read it with the cache
    (`CacheReader.read_on`), when the engine keeps a cache that checks (with `mac`: one
    that carries this key's MAC; with a `crypt`: one that opens), every chunk it lists
    included."""
    if not isinstance(engine, CachingEngine):
        return None
    opened = engine.open_cache(session_id, projection.name)
    return load_opened(engine, opened, session_id, projection, known, mac, crypt)


def load_opened(
    engine: CachingEngine,
    opened: tuple[Head, CacheReader] | None,
    session_id: str,
    projection: Any,
    known: str,
    mac: CacheMac | None = None,
    crypt: CacheCrypt | None = None,
) -> tuple[Any, Head, Chunks | None, ReadResult | None] | None:
    """`load` of the projection's cache as the engine opened it already (`opened`:
    `open_cache`'s answer, or `CachingEngine.open_cold`'s)."""
    found = _opened(opened, session_id, projection.name, crypt)
    if found is None:
        return None
    head, reader = found
    want = _Want(session_id, projection, head, known, mac)
    chunked = chunks_kept(engine, projection)
    with reader:
        got = _read(reader, want, _chunk_opener(engine, want, crypt) if chunked else None)
    if got is None:
        return None
    state, refs = got
    return state, head, Chunks(state, refs) if chunked else None, reader.read_on


def _store_chunk(
    engine: CachingEngine,
    want: _Want,
    frame: bytes,
    crypt: CacheCrypt | None,
) -> ChunkRef | None:
    """Keep `frame` as chunk `want.part`; its listing, or None: the cipher keeps none."""
    name = cache_part_name(want.projection.name, want.part)
    pieces: list[bytes] | None = _pieces(
        want.session_id, want.projection, want.part, [frame], want.head, want.known, want.mac
    )
    assert pieces is not None
    digest = pieces[-1][:-1].decode("ascii")
    if crypt is not None:
        pieces = crypt.encrypt(want.session_id, name, want.head, pieces)
        if pieces is None:
            return None
    engine.store_cache(want.session_id, name, want.head, pieces)
    h = want.head
    return (h.seq, h.link, h.h, digest)


def _chunk_kept(
    engine: CachingEngine,
    want: _Want,
    frame: bytes,
    crypt: CacheCrypt | None,
) -> ChunkRef | Literal[False] | None:
    """Chunk `want.part` as the engine keeps it already, when it is `frame` exactly as
    this process would write it at the head it names, a point of the live log
    (`open_cache` checks that): its listing, or False when that head is past
    `want.head` (a cache at `want.head` may not list it). None when there is no such
    chunk (none, of another history, damaged, another writer's of other bytes): the
    caller writes its own. Why: two writers that folded the log without a cache both
    keep every complete frame; a chunk rewritten at another head than the one a cache
    lists makes that whole cache ignored, so a writer lists the one kept instead."""
    name = cache_part_name(want.projection.name, want.part)
    found = _opened(engine.open_cache(want.session_id, name), want.session_id, name, crypt)
    if found is None:
        return None
    head, reader = found
    pieces = _pieces(
        want.session_id, want.projection, want.part, [frame], head, want.known, want.mac
    )
    with reader:
        if reader.size != sum(map(len, pieces)) or any(reader.read(len(p)) != p for p in pieces):
            return None
    if head.seq > want.head.seq:
        return False
    return (head.seq, head.link, head.h, pieces[-1][:-1].decode("ascii"))


def _add_chunks(
    engine: CachingEngine,
    want: _Want,
    chunks: Chunks,
    frames: list[bytes],
    crypt: CacheCrypt | None,
) -> int:
    """Keep `frames` (complete, in order) as the chunks after `chunks.refs`, recording
    each one kept; the bytes of the frames written, or -1 if the cipher keeps none. A
    chunk kept already as this process would write it (`_chunk_kept`) is listed as it
    is, never written again; one kept at a head past `want.head` stops it (the caller
    keeps the frames from there in its own cache and leaves that chunk alone)."""
    written = 0
    for frame in frames:
        part = want.chunk(len(chunks.refs))
        ref = _chunk_kept(engine, part, frame, crypt)
        if ref is False:
            break
        if ref is None:
            ref = _store_chunk(engine, part, frame, crypt)
            if ref is None:
                chunks.sealed_out = True
                return -1
            written += len(frame)
        chunks.refs.append(ref)
    return written


def _kept_from(
    engine: CachingEngine, want: _Want, frames: list[bytes], k: int, crypt: CacheCrypt | None
) -> int:
    """The first chunk from `k` on that is not `frames[i]` (chunk `k + i`) kept already
    (`_chunk_kept`: that very frame, at a live head). Where `_add_chunks` stopped at a
    writer's chunk past a compaction's head, the chunks after it are that writer's (of
    this very state) or the longer state's it replaced, holding messages it dropped:
    only the latter are removed."""
    for frame in frames:
        if _chunk_kept(engine, want.chunk(k), frame, crypt) is None:
            break
        k += 1
    return k


def store(
    engine: Engine,
    session_id: str,
    projection: Any,
    state: Any,
    head: Head,
    known: str,
    mac: CacheMac | None = None,
    crypt: CacheCrypt | None = None,
    chunks: Chunks | None = None,
) -> int:
    """Keep `state` (folded to `head`) for the next cold load, and say how many bytes
    that took (0: nothing kept); best effort: a failure is logged, never raised (the log
    is the truth, the cache only saves time).

    A projection kept in chunks has its complete frames written as chunk caches, but
    those `chunks` (of this very state: `chunks_of`) hold already, each one added to
    them; its own cache lists them and holds the rest. A call given no `chunks` (a
    compaction's states, a delete's empty ones) also removes the chunks a longer state
    left past this one's complete frames."""
    if head.seq == 0 or head.position is None or not isinstance(engine, CachingEngine):
        return 0
    chunked = chunks_kept(engine, projection)
    fresh = chunks is None
    chunks = chunks_of(chunks, state)
    written = 0
    try:
        pieces: list[bytes] | None
        if chunked:
            start = len(chunks.refs)
            frames, complete = projection.cache_frames_from(state, start)
            want = _Want(session_id, projection, head, known, mac)
            written = _add_chunks(engine, want, chunks, frames[:complete], crypt)
            if written < 0:
                return 0
            # the frames now chunks (fewer than `complete` where `_add_chunks` stopped)
            listed = len(chunks.refs) - start
            pieces = _pieces(
                session_id, projection, _WHOLE, frames[listed:], head, known, mac, chunks.refs
            )
        else:
            pieces = encode(session_id, projection, state, head, known, mac)
        if crypt is not None:
            pieces = crypt.encrypt(session_id, projection.name, head, pieces)
        if pieces is None:
            return 0
        engine.store_cache(session_id, projection.name, head, pieces)
        if chunked and fresh:
            # what a longer state of another history left (compaction with retention, a
            # delete's erase): its messages are not kept beside a state that dropped them
            # (a writer's chunks of this state, where `_add_chunks` stopped, stay)
            kept = _kept_from(engine, want, frames[listed:complete], len(chunks.refs), crypt)
            engine.remove_cache_parts(session_id, projection.name, kept)
    except Exception as exc:  # noqa: BLE001 - a cache must never fail what called it
        log.warning("eventstore: saving the fold cache of %r failed: %s", session_id, exc)
        return 0
    return written + sum(map(len, pieces))


def store_complete_frames(
    engine: CachingEngine,
    session_id: str,
    projection: Any,
    chunks: Chunks,
    head: Head,
    known: str,
    mac: CacheMac | None = None,
    crypt: CacheCrypt | None = None,
) -> None:
    """Keep the next complete frame of `chunks.state` (folded to `head`) not yet kept
    as a chunk, if there is one: a writer calls it after its appends, so that its close
    writes only the last, partial frame (one frame a call: a long state folded from the
    log is not written all at once by one append). Best effort, as `store`. The caller
    checked that `engine` keeps `projection`'s cache in chunks (`CachePolicy.chunked`):
    this runs after every append."""
    if chunks.sealed_out or head.position is None or head.seq == 0:
        return
    k = len(chunks.refs)
    try:
        frames, _ = projection.cache_frames_from(chunks.state, k, k + 1)
        if frames:
            want = _Want(session_id, projection, head, known, mac)
            _add_chunks(engine, want, chunks, frames[:1], crypt)
    except Exception as exc:  # noqa: BLE001 - a cache must never fail what called it
        log.warning("eventstore: saving the fold cache of %r failed: %s", session_id, exc)
