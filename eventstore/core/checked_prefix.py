"""The checked prefix of a live log: a SHA-256 of its first bytes, every one of which
passed the hash-chain check, so that a load from the start can check those bytes with
one digest instead of one BLAKE2b per line (a cold transcript load's biggest cost).

A `Prefix` is kept per session in memory: `SessionStore` extends it with the bytes its
loads check line by line from the start of the log (and a compaction starts one with the
snapshot it wrote). Appends do not extend it: hashing every batch cost an eighth of an
append, for loads that the fold caches mostly spare from folding from the start. It is
kept between processes in the engine's cache under `NAME` (written on close and after a
long checked fold), as one JSON line:

    {"format":1,"session":...,"seq":...,"link":...,"h":...,"size":...,"sha256":...}

(`seq`, `link`, `h`: the line the prefix ends with; `size`: its length in bytes).

The engine hands it back only while its head is still a point of the live log (the
same log, the same `h` before that position). A load starting at the beginning of the
live log then folds the first `size` bytes without per-line hashes *while it hashes
them*, and keeps nothing folded from them unless the digest matches at `size` and the
line there is the one recorded; otherwise it folds again from the start, checking every
line. So the trust rule of loads holds: every byte of a returned state was checked
against the hash chain, once, and this digest proves it is the same byte.
"""

import hashlib
from typing import TYPE_CHECKING, Any, NamedTuple

import msgspec

from eventstore.engines.base import (
    EMPTY_HEAD,
    CachingEngine,
    Engine,
    Head,
)
from eventstore.logger import log

if TYPE_CHECKING:
    from eventstore.signing import CacheMac

__all__ = ["FORMAT", "NAME", "Mark", "Prefix", "load", "parse", "store"]


FORMAT = 1
"""Bump when the layout changes: marks of another format are ignored."""

NAME = "@checked-prefix"
"""The engine cache name (not a plain name, so no projection's fold cache file)."""


class _Stored(msgspec.Struct, forbid_unknown_fields=True):
    format: int
    session: str
    seq: int
    link: str
    h: str
    size: int
    sha256: str


class Mark(NamedTuple):
    """A checked prefix to trust: its head (the line it ends with), its length in bytes,
    the digest of those bytes, and how many of them the engine's cache vouches for."""

    head: Head
    size: int
    digest: str
    saved: int


_decoder = msgspec.json.Decoder(_Stored)
_encoder = msgspec.json.Encoder()


class Prefix:
    """A running SHA-256 of a live log's first `size` bytes, all checked, which end
    with the line of `head`.

    `saved`: how many bytes the engine's cache holds a digest of, as far as this
    process knows (0: none)."""

    __slots__ = ("_hasher", "head", "saved", "size")

    def __init__(self) -> None:
        self._hasher = hashlib.sha256()
        self.head = EMPTY_HEAD
        self.size = 0
        self.saved = 0

    def extend(self, data: Any, head: Head) -> None:
        """Add `data`, checked bytes of the live log that follow the prefix and end
        with the line of `head`."""
        self._hasher.update(data)
        self.size += len(data)
        self.head = head

    def mark(self) -> Mark:
        """The digest of the bytes so far, with where they end."""
        return Mark(self.head, self.size, self._hasher.hexdigest(), self.saved)


def load(engine: Engine, session_id: str, mac: "CacheMac | None" = None) -> Mark | None:
    """The checked prefix the engine keeps for the session, if its head is still in the
    live log and it is this session's (with `mac`: its second line is this key's MAC of
    its first); else None (and why, at debug level)."""
    if not isinstance(engine, CachingEngine):
        return None
    return parse(engine.load_cache(session_id, NAME), session_id, mac)


def parse(
    found: tuple[Head, bytes] | None, session_id: str, mac: "CacheMac | None" = None
) -> Mark | None:
    """The checked prefix `found` holds (the engine's cache `NAME`, as `load_cache` or
    `open_cold` gives it), if it is this session's; else None, as `load` says."""
    if found is None:
        return None
    head, data = found
    if mac is not None:
        body, _, tag = data.rstrip(b"\n").rpartition(b"\n")
        if not body or tag != mac.digest([body]):
            log.debug("eventstore: checked prefix of %r ignored: not this key's", session_id)
            return None
        data = body
    try:
        kept = _decoder.decode(data.rstrip(b"\n"))
    except msgspec.MsgspecError as exc:
        log.debug("eventstore: checked prefix of %r ignored: %s", session_id, exc)
        return None
    if (
        kept.format != FORMAT
        or kept.session != session_id
        or (kept.seq, kept.link, kept.h) != (head.seq, head.link, head.h)
        or kept.size <= 0
        or len(kept.sha256) != 64
    ):
        log.debug("eventstore: checked prefix of %r ignored: not this log's", session_id)
        return None
    return Mark(head, kept.size, kept.sha256, kept.size)


def store(engine: Engine, session_id: str, prefix: Prefix, mac: "CacheMac | None" = None) -> None:
    """Keep `prefix` for later loads; best effort: a failure is logged, never raised."""
    head = prefix.head
    if head.seq == 0 or head.position is None or not isinstance(engine, CachingEngine):
        return
    mark = prefix.mark()
    data = _encoder.encode(
        _Stored(FORMAT, session_id, head.seq, head.link, head.h, mark.size, mark.digest)
    )
    try:
        tail = [b"\n"] if mac is None else [b"\n", mac.digest([data]), b"\n"]
        engine.store_cache(session_id, NAME, head, [data, *tail])
    except Exception as exc:  # noqa: BLE001 - a cache must never fail what called it
        log.warning("eventstore: saving the checked prefix of %r failed: %s", session_id, exc)
        return
    prefix.saved = mark.size
