"""The persistent folded-state cache: one projection's state of one session, saved with
the head it was folded to, so a cold load folds only the lines after it.

The format (the bytes an engine keeps with `Engine.store_cache`; the engine adds and
checks where in the log the head is):

    <JSON header>\\n<the projection's encode_state bytes>\\n<digest, 32 hex>\\n

The header names the format, the session, the projection and its version, the event
types the folding process could decode of those the projection reads, with the version
and upcasters it read each with (`known`, a digest: a process that skipped one of them,
or upcast old lines of one another way, folded another state), and the head (`seq`, `link`,
`h`). The digest is a SHA-256 (its first 128 bits; hardware-accelerated
where BLAKE2b is not, and read on every cold load) over everything before it, so it binds
the state to the chain hash `h` at its position (which hashes every line before it)
and to the session and projection.

The trust rule of loads holds: every byte that went into a state this library returns
was hash-checked once. A cache is written only from states folded from checked lines (or
read from a checked cache), and a cache is used only when all of this holds, else it is
ignored (and rewritten later), never trusted:

- the engine found the head's position still in the session's live log: same log
  identity, long enough, and the `h` of the line before the position is the cached `h`
  (`Engine.load_cache`);
- the digest matches the bytes, and the header's session, projection, version, `known`,
  `seq` and `h` are the ones expected;
- the state decodes as the projection's state type.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from .engines.base import Engine, Head

__all__ = ["FORMAT", "decode", "encode", "known_types", "load", "store"]

log = logging.getLogger("eventstore")

FORMAT = 3
"""Bump when the layout of a cache changes: caches of another format are ignored.
(1: the digest was a BLAKE2b; 2: no `known`.)"""

_DIGEST_HEX = 32


class _Header(msgspec.Struct, forbid_unknown_fields=True):
    format: int
    session: str
    projection: str
    version: int
    known: str
    seq: int
    link: str
    h: str


_header_decoder = msgspec.json.Decoder(_Header)
_encoder = msgspec.json.Encoder()


def _digest(body: bytes) -> bytes:
    return hashlib.sha256(body).hexdigest()[:_DIGEST_HEX].encode("ascii")


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


def encode(session_id: str, projection: Any, state: Any, head: Head, known: str) -> bytes:
    """The cache bytes of `state`, folded to `head` by a process whose `known_types` for
    `projection` are `known`, for `session_id`."""
    header = _Header(
        FORMAT,
        session_id,
        projection.name,
        projection.version,
        known,
        head.seq,
        head.link,
        head.h,
    )
    body = b"".join((_encoder.encode(header), b"\n", projection.encode_state(state), b"\n"))
    return body + _digest(body) + b"\n"


def decode(data: bytes, session_id: str, projection: Any, head: Head, known: str) -> Any | None:
    """The state a cache holds, if it is intact and is this session's and projection's
    state at `head` (by seq and `h`), folded knowing the event types `known` says; else
    None (and why, at debug level)."""
    why = _check(data, session_id, projection, head, known)
    if isinstance(why, str):
        log.debug("eventstore: fold cache of %r/%s ignored: %s", session_id, projection.name, why)
        return None
    return why[0]


def _check(
    data: bytes, session_id: str, projection: Any, head: Head, known: str
) -> str | tuple[Any]:
    if len(data) < _DIGEST_HEX + 2 or data[-1:] != b"\n":
        return "too short"
    body, digest = data[: -_DIGEST_HEX - 1], data[-_DIGEST_HEX - 1 : -1]
    if _digest(body) != digest:
        return "the digest does not match"
    nl = body.find(b"\n")
    if nl < 0 or body[-1:] != b"\n":
        return "malformed"
    try:
        header = _header_decoder.decode(body[:nl])
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
    try:
        return (projection.decode_state(body[nl + 1 : -1]),)
    except (msgspec.MsgspecError, ValueError, TypeError) as exc:
        return f"the state does not decode: {exc}"


def load(engine: Engine, session_id: str, projection: Any, known: str) -> tuple[Any, Head] | None:
    """The cached state and its head, when the engine keeps a cache that checks."""
    found = engine.load_cache(session_id, projection.name)
    if found is None:
        return None
    head, data = found
    state = decode(data, session_id, projection, head, known)
    return None if state is None else (state, head)


def store(
    engine: Engine, session_id: str, projection: Any, state: Any, head: Head, known: str
) -> None:
    """Keep `state` (folded to `head`) for the next cold load; best effort: a failure is
    logged, never raised (the log is the truth, the cache only saves time)."""
    if head.seq == 0 or head.position is None:
        return
    try:
        engine.store_cache(
            session_id, projection.name, head, encode(session_id, projection, state, head, known)
        )
    except Exception as exc:  # noqa: BLE001 - a cache must never fail what called it
        log.warning("eventstore: saving the fold cache of %r failed: %s", session_id, exc)
