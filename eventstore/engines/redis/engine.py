"""The Redis engine: sessions on a Redis (or Valkey) server that a fleet already runs.

`SessionStore("redis://host:6379/0")` (or `rediss://` for TLS, `unix:///path.sock`) opens
it; `eventstore.engines.redis.url` says which query parameters are the engine's (`prefix`,
`ttl`, `feed`, `feed_maxlen`) and which go to the client. Needs the `[redis]` extra.

What it stores, key by key, and the scripts that change it are in
`eventstore.engines.redis.scripts`. In short: a session's live log is a list of its
batches' exact bytes (so the hash chain, verify and export agree byte for byte with the
file engine) beside a hash holding its head; an append is one EVALSHA (one round trip,
atomic on the server) that compares the head with the expected one, pushes the batch,
moves the head, wakes followers, adds the batch to the global feed, updates the session
index (`IndexingEngine`: sorted sets by updated, created and id) and refreshes the
session's expiry. The face's fold caches are a hash beside the session, given back with
the appends after them in one read script; lines are read by seq through a list of the
live log's appends (first seq, end) that the writing scripts keep. The face checks
idempotency keys against its own projection after catching up
(`eventstore.engines.base`), and the head check makes that race-free, so the script
stores no key. An append whose reply was lost (the connection dropped) is sent once
more: the script recognises its own batch at the head and answers as if it had just
written it; if the head moved meanwhile, `StorageError` says it may or may not be
committed (retry with the same idempotency key: it lands once).

Durability: "flush" is an append acknowledged by the server (in its memory, and in the
AOF as the server's `appendfsync` says); "fsync" needs a server that writes its AOF with
`appendfsync always` (checked when the engine opens), or Redis 7.2 or newer with the AOF
on and `appendfsync everysec`, where every append is followed, in the same round trip,
by `WAITAOF 1 0`. Any other
server refuses "fsync" with `RedisDurabilityError` naming the setting to change.

Positions are (gen, batches, bytes): `gen` names the live log and is new whenever it is
replaced (a snapshot installed, a repair, a removal), which is how a reader knows to
start over. `wait` blocks on the session's wake stream with XREAD BLOCK (the caller
always re-reads, so a reconnection never loses or repeats a line). The global feed is
one stream (`FeedEngine`); its ids come from the server's clock and never go back, even
after a restart from the AOF (the stream keeps its last id).
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any, NamedTuple, TypeVar

import msgspec

from eventstore.engines.base import (
    EMPTY_HEAD,
    READ_AHEAD,
    BytesCacheReader,
    BytesSegment,
    CacheReader,
    CachingEngine,
    ColdStart,
    Durability,
    EncodedBatch,
    FeedEngine,
    Head,
    HeadMovedError,
    History,
    IndexEntry,
    IndexingEngine,
    IndexOrder,
    InstallResult,
    KeyEngine,
    Position,
    PrunedSegment,
    PruningEngine,
    ReadResult,
    RepairHold,
    Segment,
    SeqEngine,
    SeqLine,
    UnreadableSegment,
    cache_part_name,
    head_disputed,
    index_matches,
    read_whole,
    redact_text,
)
from eventstore.engines.raw import last_line_end, raw_end
from eventstore.engines.redis import scripts
from eventstore.engines.redis.url import RedisUrl, split_url, ttl_ms
from eventstore.errors import (
    CorruptLogError,
    HistoryUnavailableError,
    InvalidArgumentError,
    InvalidSessionIdError,
    StorageError,
    UnsupportedError,
)
from eventstore.format.chain import split_hash
from eventstore.session_ids import validate_session_id

try:
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "the Redis engine needs the [redis] extra: pip install 'harness-eventstore[redis]'"
    ) from exc

# the client's version for CLIENT SETINFO, given rather than looked up: redis-py looks
# it up in the installed packages' metadata, ~6 ms of a fresh process's first connect
try:
    from redis.driver_info import DriverInfo

    _DRIVER: dict[str, Any] = {"driver_info": DriverInfo(lib_version=redis.__version__)}
except ImportError:  # pragma: no cover - redis-py before DriverInfo
    _DRIVER = {"lib_version": redis.__version__}

SOCKET_TIMEOUT = 30.0  # seconds; above the 5 s of a follower's XREAD BLOCK
# seconds an append whose reply was lost is sent again before it is a StorageError ("may
# or may not be committed"): rides out a failover or a killed connection, not an outage
RETRY_WINDOW = 10.0

__all__ = [
    "FEED_START",
    "RedisDurabilityError",
    "RedisEngine",
    "RedisFeedEngine",
    "RedisFeedEntry",
    "RedisFeedPosition",
    "RedisPosition",
    "from_url",
]

T = TypeVar("T")
_CACHES = 11  # where the caches' key is in a session's keys (`RedisEngine._keys`)
_ORDINARY_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_labels_decoder = msgspec.json.Decoder(dict[str, str])
_HOLD_MS = 60_000  # a repair hold expires if its holder died
_WAITAOF_MS = 10_000


class RedisDurabilityError(UnsupportedError):
    """`durability="fsync"` against a Redis server that cannot make an append survive
    power loss before acknowledging it; the message names the setting to change."""


class RedisPosition(msgspec.Struct, Position, frozen=True):
    """A place in one live log: its `gen`, the batches read (`n`) and their bytes."""

    gen: str
    n: int
    size: int


class RedisFeedPosition(NamedTuple):
    """A place in the global feed: the stream entry's id (`ms`, `sq`) and the line's
    index within its batch. Ordered; store it as the three integers."""

    ms: int
    sq: int
    line: int


FEED_START = RedisFeedPosition(0, 0, -1)


class RedisFeedEntry(msgspec.Struct, frozen=True):
    """One line of the global feed: its position, the session, the line's seq, its
    exact bytes."""

    position: RedisFeedPosition
    session_id: str
    seq: int
    line: bytes


def from_url(url: str | os.PathLike[str], **options: Any) -> RedisEngine:
    """Open the Redis engine a `redis://`, `rediss://` or `unix://` URL names.

    Options: `durability` ("flush" or "fsync", see the module docstring), `ttl`
    (seconds; the URL's `ttl=` otherwise), `create` (False: a store opened only to be
    read, which writes nothing, not even the session index's version key)."""
    durability = options.pop("durability", "flush")
    ttl = options.pop("ttl", None)
    create = bool(options.pop("create", True))
    if options:
        raise InvalidArgumentError(f"unknown Redis engine options: {', '.join(sorted(options))}")
    parsed = split_url(os.fspath(url))
    if ttl is not None:
        parsed = RedisUrl(
            parsed.client, parsed.shown, parsed.password, parsed.prefix,
            ttl_ms(ttl, parsed.shown), parsed.feed, parsed.feed_maxlen,
        )  # fmt: skip
    cls = RedisFeedEngine if parsed.feed else RedisEngine
    return cls(parsed, durability=durability, create=create)


def session_tag(session_id: str) -> str:
    """The hash tag of a session's keys: an ordinary id itself (a person finds it with
    `redis-cli --scan`), any other the SHA-256 of its UTF-8 after `~` (which no ordinary
    id starts with): no id can reach another session's keys or break out of the tag."""
    if _ORDINARY_ID.fullmatch(session_id):
        return session_id
    return "~" + hashlib.sha256(session_id.encode("utf-8")).hexdigest()[:40]


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _head_of(c: list[Any], where: str) -> Head:
    """A Head from a script's [gen, seq, link, hh, base, size, n]; CorruptLogError for a
    number field that is no whole number (the head hash edited from outside)."""
    gen, nums = _text(c[0]), [_text(c[i]) for i in (1, 5, 6, 4)]
    if not all(x.isascii() and x.isdigit() for x in nums):
        raise CorruptLogError(where, 0, None, f"its head's seq, size, n, base are {nums}")
    seq, size, n, base = map(int, nums)
    if not gen or (seq == 0 and size == 0):
        return EMPTY_HEAD
    return Head(seq, _text(c[2]), _text(c[3]), RedisPosition(gen, n, size), size, base)


def _ends_at(where: str, data: bytes, head: Head, offset: int) -> None:
    """CorruptLogError unless `data` (batches read up to `head`) ends with the head's line
    (its seq, h and link): a head edited from outside would be built on. A last line
    that does not decode is left to the fold to report."""
    last = last_line_end(data)
    if last is not None and (last.seq, last.h, last.link) != (head.seq, head.h, head.link):
        raise CorruptLogError(
            where, offset + last.start, last.seq,
            f"the live log ends with seq {last.seq} (h {last.h}) but its head is at seq"
            f" {head.seq} (h {head.h}, link {head.link}): edited from outside the store",
        )  # fmt: skip


def _seq_lines(out: list[Any]) -> dict[int, SeqLine]:
    """The lines of a LINES_AT or TAIL answer ([seq, line, offset, before] each), by seq."""
    return {
        int(seq): SeqLine(bytes(line[:-1]), int(offset), bytes(before))
        for seq, line, offset, before in zip(*[iter(out)] * 4, strict=True)
    }


def _counted(where: str, n: object, got: int) -> None:
    """CorruptLogError unless the live log's appends (`got`) are the `n` its head counts
    (as stored: `_count_of`): the list or the head edited or deleted from outside (the
    lines left would pass as the whole log)."""
    n = _count_of(where, n)
    if got != n:
        raise CorruptLogError(
            where, 0, None,
            f"its head counts {n} appends but the live log holds {got}: edited or deleted"
            " from outside the store",
        )  # fmt: skip


def _count_of(where: str, n: object) -> int:
    """The head's count of appends (`n`) as stored (None: no head, 0), or
    CorruptLogError naming the session when it is not the whole number the scripts
    write (edited from outside: never a bare ValueError, and never read as a count)."""
    text = "0" if n is None else _text(n)
    if re.fullmatch(r"[0-9]+", text) is None:
        raise CorruptLogError(
            where, 0, None,
            "its head's count of appends (n) is not a number: edited from outside the store",
        )  # fmt: skip
    return int(text)


def _archived(where: str, bounds: list[bytes], blobs: list[bytes]) -> list[Segment]:
    """The archived segments of a session's archive list and its bounds list (`a`,
    `b`); CorruptLogError naming the session when the two do not pair up (one deleted
    or edited from outside, or evicted apart: a segment would be read under another's
    seqs)."""
    pairs = [bound.split() for bound in bounds]
    if len(blobs) != len(bounds) or not all(
        len(p) == 2 and all(x.isdigit() for x in p) for p in pairs
    ):
        raise _unpaired(where, len(blobs), len(bounds))
    segments: list[Segment] = []
    for (first, last), blob in zip(((int(a), int(b)) for a, b in pairs), blobs, strict=True):
        name = f"{where}/archive/{first:012d}-{last:012d}"
        segments.append(BytesSegment(blob, name, True, first, last))
    return segments


def _unpaired(where: str, segments: int, bounds: int) -> CorruptLogError:
    """The error for a session whose archive list and bounds list (`a`, `b`) do not
    pair up: no segment can be told its seqs, nor pruned by them."""
    return CorruptLogError(
        where, 0, None,
        f"its archive's {segments} segments and {bounds} bounds of segments do not pair"
        " up: edited or deleted from outside the store",
    )  # fmt: skip


def _headless(where: str, segments: int) -> CorruptLogError:
    """The error for a session with an archive but no head (its head and live log
    deleted or evicted from outside, the archive left): neither the old session (its
    live log is gone) nor no session (a new one would take the archive for its own)."""
    return CorruptLogError(
        where, 0, None,
        f"its archive holds {segments} segments but it has no head: its head and live log"
        " were deleted or evicted from outside the store (restore it, or purge it)",
    )  # fmt: skip


def _index_fields_edited(where: str) -> CorruptLogError:
    """The error for a session whose index fields in its head hash are not what the
    store writes (their values not quoted: they are whatever an outsider put there)."""
    return CorruptLogError(
        where, 0, None,
        "its session index fields (cr, up, lb, seq, base, size) are not what"
        " the store writes: edited from outside the store",
    )  # fmt: skip


_IX_TIME = re.compile(rb"[0-9a-f]{14}")


def _member_sid(member: bytes, order: str) -> str | None:
    """The session id a member of the index's set for `order` names (after its 14 hex
    digits of time, but in the ids' set), or None when it names none a session could
    have (not UTF-8, no time, an id the store refuses): added from outside, no session's
    own, so a page passes over it and a rebuild drops it."""
    if order != "id" and _IX_TIME.fullmatch(member[:14]) is None:
        return None
    try:
        return validate_session_id((member if order == "id" else member[14:]).decode("utf-8"))
    except (UnicodeDecodeError, InvalidSessionIdError):
        return None


def _own_member(member: bytes, sid: str, field: str, times: dict[str, int]) -> bool:
    """Whether a member of the index's set for `field` ("up", "cr"; "" for the ids) is
    the one session `sid`'s index times (`times`, as its head hash holds them) make."""
    return not field or scripts.ixkey(times[field]) + sid == member.decode()


def _kept_at(fields: list[str], gen: str) -> bool:
    """Whether a cache's kept head ("gen seq link hh base size n" split) is one of the
    live log `gen` (as `scripts.CACHE_OPEN` checks it, but for where its line is)."""
    return (
        len(fields) == 7
        and fields[0] == gen
        and all(fields[i].isascii() and fields[i].isdigit() for i in (1, 4, 5, 6))
        and int(fields[6]) >= 1
    )


# compare and delete in one step (a script runs alone): a slot replaced meanwhile is kept
_REMOVE_IF_SAME = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
)
# compare and set in one step: a slot forgotten meanwhile is never rewritten by a rekey
_REPLACE_IF_SAME = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('SET', KEYS[1], ARGV[2])"
    " return 1 end return 0"
)


class RedisEngine(CachingEngine, SeqEngine, PruningEngine, KeyEngine, IndexingEngine):
    """Sessions on a Redis server: see the module docstring. The face's fold caches
    (`CachingEngine`: a hash beside the session), lines by seq (`SeqEngine`: through an
    index of the live log's elements), pruning (`PruningEngine`), the session index
    (`IndexingEngine`: sorted sets the append script writes); `RedisFeedEngine` adds
    the global feed."""

    def __init__(
        self, parsed: RedisUrl, *, durability: Durability = "flush", create: bool = True
    ) -> None:
        if durability not in ("flush", "fsync"):
            raise InvalidArgumentError(f"durability must be 'flush' or 'fsync', not {durability!r}")
        self.url = parsed.shown
        self._parsed = parsed
        self._prefix = parsed.prefix
        self._ttl = parsed.ttl_ms
        self._feed_key = f"{parsed.prefix}:feed"
        self._feed_maxlen = (parsed.feed_maxlen or 0) if parsed.feed else -1
        self._closed = False
        try:
            # typed Any: the client's stubs type replies loosely; every reply is checked here
            # a reply that never comes (a killed or paused connection) is a StorageError
            # after SOCKET_TIMEOUT, never a hang; `?socket_timeout=` in the URL wins
            self._client: Any = redis.Redis.from_url(
                parsed.client,
                retry=Retry(NoBackoff(), 0),
                socket_timeout=SOCKET_TIMEOUT,
                **_DRIVER,
            )
        except (ValueError, redis.RedisError) as exc:
            raise InvalidArgumentError(self._scrub(f"{self.url}: {exc}")) from None
        self._scripts: dict[str, Any] = {
            name: self._client.register_script(getattr(scripts, name))
            for name in (
                "APPEND",
                "READ",
                "INSTALL",
                "REMOVE",
                "REWRITE",
                "RELEASE",
                "PRUNE",
                "INDEX_SET",
                "INDEX_DROP",
                "CACHE_STORE",
                "CACHE_OPEN",
                "CACHE_DROP_PARTS",
                "LINES_AT",
                "TAIL",
            )  # fmt: skip
        }
        self._ix_keys = [f"{parsed.prefix}:ix:{k}" for k in ("u", "c", "i")]
        self._ix_version = f"{parsed.prefix}:ix:v"
        self._waitaof = False
        self._create = create
        self._call("connecting", lambda: self._client.ping())
        # a store that has no session yet is marked indexed now, before its first append:
        # otherwise its first page would take the sessions written since for a release's
        # without the index and rebuild (read every session) once. Best effort: the mark
        # is a write, which a paused server (a failover) holds back; the open goes on
        with suppress(StorageError):
            self.index_stale()
        if durability == "fsync":
            self._waitaof = self._check_fsync()

    # -- plumbing -----------------------------------------------------------------------

    def _scrub(self, text: str) -> str:
        """`text` with URLs redacted and the password itself, however it shows, hidden."""
        text = redact_text(text)
        pw = self._parsed.password
        if pw:
            from urllib.parse import unquote

            for form in {pw, unquote(pw)}:
                if form:
                    text = text.replace(form, "***")
        return text

    def _error(self, doing: str, exc: BaseException) -> StorageError:
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return StorageError(self._scrub(f"{self.url}: {doing} failed: {text}"))

    def _call(self, doing: str, fn: Callable[[], T], tries: int = 3) -> T:
        """`fn()` (a read, safe to repeat): again on a fresh connection when the server
        dropped the one used (after a restart every pooled connection is dead)."""
        if self._closed:
            raise StorageError(f"{self.url}: the engine is closed")
        for left in range(tries - 1, -1, -1):
            try:
                return fn()
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                if not left:
                    raise self._error(doing, exc) from None
                time.sleep(0.05)
            except redis.RedisError as exc:
                raise self._error(doing, exc) from None
        raise AssertionError("unreachable")

    def _check_fsync(self) -> bool:
        """Whether appends need WAITAOF (False: the server fsyncs before it replies);
        `RedisDurabilityError` when the server cannot honour "fsync"."""
        info = self._call("reading the server's persistence", lambda: self._client.info())
        version = tuple(int(x) for x in str(info.get("redis_version", "0.0")).split(".")[:2])
        aof = int(info.get("aof_enabled", 0)) == 1
        try:
            fsync = self._client.config_get("appendfsync").get("appendfsync")
        except redis.RedisError:
            fsync = None  # CONFIG may be disabled (a managed service)
        if aof and fsync == "always":
            return False
        if aof and version >= (7, 2) and fsync == "everysec":
            # not with `appendfsync no`: the server never fsyncs, WAITAOF would wait on the OS
            return True
        need = "appendonly yes" if not aof else "appendfsync always"
        raise RedisDurabilityError(
            f"{self.url}: durability='fsync' needs the server to fsync its AOF before it"
            f" acknowledges a write: set `{need}`"
            + (" and `appendfsync always`" if not aof else "")
            + f" (CONFIG SET or redis.conf; found appendonly={'yes' if aof else 'no'},"
            f" appendfsync={fsync or 'unknown'}), or Redis 7.2+ with the AOF on and"
            " `appendfsync everysec` (WAITAOF)"
        )

    def _script(self, name: str, keys: list[str], args: list[Any]) -> list[Any]:
        """Script `name` run by its SHA; one the server does not hold (a restart flushed
        its cache) is sent whole, which caches it too. Not SCRIPT LOAD: Redis holds that
        back while writes are paused (CLIENT PAUSE WRITE, as a FAILOVER does); the read
        script goes as EVALSHA_RO/EVAL_RO, which a pause never holds, cached or not (a
        plain EVALSHA of a script the server lacks is held: it cannot see its flags)."""
        script = self._scripts[name]
        ro = name in scripts.READ_ONLY
        n = len(keys)
        try:
            if ro:
                return self._client.evalsha_ro(script.sha, n, *keys, *args)  # type: ignore[no-any-return]
            return self._client.evalsha(script.sha, n, *keys, *args)  # type: ignore[no-any-return]
        except redis.exceptions.NoScriptError:
            if ro:
                return self._client.eval_ro(script.script, n, *keys, *args)  # type: ignore[no-any-return]
            return self._client.eval(script.script, n, *keys, *args)  # type: ignore[no-any-return]

    def _keys(self, session_id: str) -> list[str]:
        validate_session_id(session_id)
        tag = session_tag(session_id)
        keys = [f"{self._prefix}:{{{tag}}}:{k}" for k in scripts.KINDS]
        keys.append(self._feed_key if self._feed_maxlen >= 0 else keys[5])
        own = f"{self._prefix}:{{{tag}}}:"
        return [*keys, *self._ix_keys, own + scripts.CACHES, own + scripts.OFFSETS]

    def where(self, session_id: str) -> str:
        """A session's live log's name for messages."""
        return f"{self.url}#{session_id}"

    def _run(self, name: str, session_id: str, args: list[Any], doing: str) -> list[Any]:
        keys = self._keys(session_id)
        return self._call(doing, lambda: self._script(name, keys, args))

    # -- reading ------------------------------------------------------------------------

    def read(self, session_id: str, position: Position | None) -> ReadResult:
        """The committed lines after `position` (None: from the beginning): one script."""
        pos = position if isinstance(position, RedisPosition) else None
        args = [pos.gen, pos.n] if pos is not None else ["", 0]
        out = self._run("READ", session_id, args, "reading a session")
        where = self.where(session_id)
        head = _head_of(out, where)
        _counted(where, int(out[6]) if out[0] else 0, int(out[7]) + len(out[8:]))
        data = b"".join(out[8:])
        if data:
            _ends_at(where, data, head, pos.size if pos is not None and out[7] else 0)
        if pos is not None and int(out[7]) == pos.n and _text(out[0]) == pos.gen:
            return ReadResult(data, head, False, where, pos.size)
        return ReadResult(data, head, position is not None, where, 0)

    def lines_at(self, session_id: str, seqs: Sequence[int]) -> dict[int, SeqLine]:
        """One script: each line found through the live log's index (`scripts.LINES_AT`),
        with the end of the line before it; nothing for a log written before the index
        existed (until its next compaction or repair)."""
        want = sorted({int(s) for s in seqs if int(s) > 0})
        if not want:
            return {}
        out = self._run("LINES_AT", session_id, want, f"reading lines of {session_id!r} by seq")
        return _seq_lines(out)

    def tail(self, session_id: str, count: int) -> tuple[Head, dict[int, SeqLine]]:
        """One script (`scripts.TAIL`): the head, then the newest `count` lines as
        `lines_at` finds them."""
        out = self._run(
            "TAIL", session_id, [max(1, int(count))], f"reading the end of {session_id!r}"
        )
        return _head_of(out, self.where(session_id)), _seq_lines(out[7:])

    def head(self, session_id: str) -> Head:
        """The session's head (one hash), with its live log's length in the same round
        trip: a log whose head hash is gone (deleted from outside) is CorruptLogError
        naming the session, not an empty session (its state read as empty, exit 0)."""
        key, live = self._keys(session_id)[:2]

        def run() -> list[Any]:
            pipe = self._client.pipeline(transaction=False)
            pipe.hmget(key, ["gen", "seq", "link", "hh", "base", "size", "n"])
            pipe.llen(live)
            return pipe.execute()  # type: ignore[no-any-return]

        c, batches = self._call("reading a head", run)
        if c[0] is None:
            _counted(self.where(session_id), None, int(batches))
            return EMPTY_HEAD
        return _head_of(c, self.where(session_id))

    def history(self, session_id: str) -> History:
        """The archived segments then the live log, read in one MULTI/EXEC."""
        h, live, arch, bounds, *_ = self._keys(session_id)
        where = self.where(session_id)

        def run() -> list[Any]:
            pipe = self._client.pipeline(transaction=True)
            pipe.hmget(h, ["tail", "n", "gen"])
            pipe.lrange(bounds, 0, -1)
            pipe.lrange(arch, 0, -1)
            pipe.lrange(live, 0, -1)
            return pipe.execute()  # type: ignore[no-any-return]

        (tail, n, gen), bounds_l, blobs, items = self._call("reading a session's history", run)
        data = b"".join(items) + (tail or b"")
        try:
            segments = _archived(where, bounds_l, blobs)
            if gen is None and segments:
                raise _headless(where, len(blobs))
        except CorruptLogError as exc:
            # the whole history one unreadable segment: no read takes the rest for it
            return History([UnreadableSegment(b"".join(blobs) + data, where, exc)])
        try:
            _counted(where, n, len(items))
        except CorruptLogError as exc:  # (reported by whoever reads it: verify says so)
            segments.append(UnreadableSegment(data, where, exc))
        else:
            if data:
                segments.append(BytesSegment(data, where, False))
        return History(segments)

    def wait(self, session_id: str, position: Position | None, timeout: float) -> bool:
        """Block on the session's wake stream (XREAD BLOCK) until its head is no longer
        `position` (True) or `timeout` seconds pass (False). The stream's last id is read
        before the head, so a change between the two ends the block at once."""
        deadline = time.monotonic() + max(timeout, 0.0)
        wake = self._keys(session_id)[5]
        while True:
            if self._closed:
                raise StorageError(f"{self.url}: the engine is closed")
            try:
                last = self._client.xrevrange(wake, count=1)
                since = last[0][0] if last else b"0-0"
                if self.head(session_id).position != position:
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._client.xread({wake: since}, block=max(1, int(min(left, 5.0) * 1000)))
            except (redis.ConnectionError, redis.TimeoutError, StorageError):
                return True  # the connection dropped: wake the caller, who re-reads
            except redis.RedisError as exc:
                raise self._error("waiting", exc) from None

    # -- writing ------------------------------------------------------------------------

    def append(self, session_id: str, batch: EncodedBatch, expected: Head) -> Head:
        """One EVALSHA (see `eventstore.engines.redis.scripts`): the head compared, the
        batch pushed, followers woken, the feed and the expiry updated, atomically."""
        if not batch.data.endswith(b"\n"):
            raise ValueError("an encoded batch must end with a newline")
        keys = self._keys(session_id)
        args = [
            expected.seq, expected.link, batch.first_seq, batch.last_seq,
            batch.hashes[-1] if batch.hashes else "", batch.link, batch.data,
            session_id, os.urandom(8).hex(), self._ttl, self._feed_maxlen,
            batch.ts_us or "",  # 0: unknown, the server's clock
            "" if batch.labels is None else msgspec.json.encode(batch.labels),
        ]  # fmt: skip
        doing = f"appending seq {batch.first_seq}..{batch.last_seq} to {session_id!r}"
        lost = False
        deadline = time.monotonic() + RETRY_WINDOW
        delay = 0.0
        while True:
            if self._closed:
                raise StorageError(f"{self.url}: the engine is closed")
            sent = time.monotonic()
            try:
                out = self._append_once(keys, args)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                # sent again as is, on a fresh connection, until the window closes: the
                # script knows its own batch at the head, so a repeat never lands twice
                lost = True
                now = time.monotonic()
                if now >= deadline:
                    raise self._lost(session_id, batch, exc) from None
                # held by a live server then dropped (a CLIENT KILL, a failover): again at
                # once, so a batch is in flight whenever writes resume; refused at once
                # (the server is away): back off, up to 0.1 s
                delay = 0.0 if now - sent >= 0.005 else min(max(2 * delay, 0.002), 0.1)
                time.sleep(min(delay, max(deadline - now, 0.0)))
                continue
            except redis.RedisError as exc:
                raise self._error(doing, exc) from None
            status = int(out[0])
            if status == 2:  # a repair holds the session: wait for it
                time.sleep(0.005)
                continue
            if status == 3:  # nothing was written
                _counted(self.where(session_id), out[2], int(out[1]))
            if status == 4:  # nothing was written
                raise _index_fields_edited(self.where(session_id))
            if status == 5:  # nothing was written
                raise _headless(self.where(session_id), int(out[1]))
            head = _head_of(out[1:], self.where(session_id))
            if status == 1:
                if lost:
                    raise self._lost(session_id, batch, None)
                raise HeadMovedError(self.where(session_id), expected, head)
            return head

    def _append_once(self, keys: list[str], args: list[Any]) -> list[Any]:
        if not self._waitaof:
            return self._script("APPEND", keys, args)
        pipe = self._client.pipeline(transaction=False)
        self._scripts["APPEND"](keys=keys, args=args, client=pipe)
        pipe.execute_command("WAITAOF", 1, 0, _WAITAOF_MS)
        out, (local, _) = pipe.execute()
        if int(out[0]) == 0 and int(local) < 1:
            raise StorageError(f"{self.url}: the server did not fsync its AOF in time (WAITAOF)")
        return out  # type: ignore[no-any-return]

    def _lost(self, session_id: str, batch: EncodedBatch, exc: BaseException | None) -> Exception:
        why = f": {str(exc).strip() or type(exc).__name__}" if exc is not None else ""
        return StorageError(
            self._scrub(
                f"{self.where(session_id)}: append of seq {batch.first_seq}..{batch.last_seq}"
                f" failed (the connection was lost; it may or may not be committed){why}"
            )
        )

    def _write(self, name: str, session_id: str, args: list[Any], doing: str) -> list[Any]:
        """A write script other than append, waiting while a repair holds the session
        (not sent again on a lost reply: it may have run)."""
        keys = self._keys(session_id)
        while True:
            out: list[Any] = self._call(doing, lambda: self._script(name, keys, args), tries=1)
            if int(out[0]) != 2:
                return out
            time.sleep(0.005)

    def install_snapshot(
        self, session_id: str, line: bytes, covers: Head, *, keep_history: bool
    ) -> InstallResult:
        """One script: the live log replaced by the snapshot line and the batches after
        `covers`, the replaced ones archived (or dropped), atomically."""
        split = split_hash(line.rstrip(b"\n"))
        if not line.endswith(b"\n") or split is None:
            raise ValueError("a snapshot line must be one hashed line ending in a newline")
        pos = covers.position
        if not isinstance(pos, RedisPosition):
            raise HeadMovedError(self.where(session_id), covers, self.head(session_id))
        args = [
            pos.gen, pos.n, covers.seq, line, split[1], int(keep_history),
            os.urandom(8).hex(), self._ttl,
        ]  # fmt: skip
        out = self._write("INSTALL", session_id, args, f"installing a snapshot of {session_id!r}")
        head = _head_of(out[1:8], self.where(session_id))
        if int(out[0]) == 1:
            raise HeadMovedError(self.where(session_id), covers, head)
        archived = None
        if _text(out[9]) == "1":
            first = int(out[10])
            archived = f"{self.where(session_id)}/archive/{first:012d}-{covers.seq:012d}"
        return InstallResult(head, archived, int(out[8]), head.size)

    def prune_history(self, session_id: str, before_seq: int) -> list[PrunedSegment]:
        """Drop the archived segments whose last line comes before `before_seq`."""
        out = self._write("PRUNE", session_id, [before_seq, self._ttl], "pruning history")
        where = self.where(session_id)
        if int(out[0]) == 3:  # nothing was dropped
            raise _unpaired(where, int(out[1]), int(out[2]))
        gone = []
        for bound, size in zip(out[1::2], out[2::2], strict=True):
            first, last = (int(x) for x in bound.split())
            name = f"{where}/archive/{first:012d}-{last:012d}"
            gone.append(PrunedSegment(name, first, last, int(size)))
        return gone

    @contextmanager
    def hold(self, session_id: str) -> Iterator[RepairHold]:
        """The session's hold key, set (with an expiry, in case the holder dies) until the
        block ends; appends, installs and removals wait while it is held."""
        keys = self._keys(session_id)
        token = os.urandom(12).hex()
        while not self._call(
            "holding a session for repair",
            lambda: self._client.set(keys[6], token, nx=True, px=_HOLD_MS),
        ):
            time.sleep(0.005)
        try:
            yield _RedisRepairHold(self, session_id, keys, token)
        finally:
            self._call(
                "releasing a repair hold",
                lambda: self._script("RELEASE", [keys[6]], [token]),
            )

    # -- caches (`CachingEngine`): the hash `c`, see `eventstore.engines.redis.scripts` --

    def open_cache(self, session_id: str, name: str) -> tuple[Head, CacheReader] | None:
        """The cache kept under `name`, checked against the live log and read in one
        script, with the head and up to `READ_AHEAD` batches after the cache's head (the
        reader's `read_on`, which the fold from the cache takes instead of reading)."""
        return self._open(session_id, name, None, READ_AHEAD, False).cache

    def load_cache(self, session_id: str, name: str) -> tuple[Head, bytes] | None:
        """`open_cache`, read whole, without the batches after it (a small cache, such
        as a checked prefix, after which no fold follows)."""
        return read_whole(self._open(session_id, name, None, -1, False).cache)

    def open_cold(self, session_id: str, name: str | None, mark: str | None) -> ColdStart:
        """The cache `name`, else the mark and the live log from its start (up to
        `READ_AHEAD` batches), all in the one script that reads a cache."""
        return self._open(session_id, name, mark, READ_AHEAD, True)

    def _open(
        self, session_id: str, name: str | None, mark: str | None, ahead: int, start: bool
    ) -> ColdStart:
        """`scripts.CACHE_OPEN`'s reply as a `ColdStart` (the read on, when it came,
        is the cache reader's, or, with `start`, the log's from its start when no cache
        was found)."""
        args = [name or "", mark or "", ahead, int(start)]
        out = self._run("CACHE_OPEN", session_id, args, "reading a fold cache")
        found, where = _text(out[0]), self.where(session_id)
        cache = kept = read_on = None
        offset = first = 0  # the read on's first byte and batch
        if "c" in found:
            at = _text(out[1]).split(" ")
            head = _head_of(at, where)
            cache, offset, first = (head, BytesCacheReader(bytes(out[2]))), head.size, int(at[6])
        elif "m" in found:
            kept = (_head_of(_text(out[3]).split(" "), where), bytes(out[4]))
        if "r" in found:
            at = _text(out[5]).split(" ")
            now = _head_of(at, where)
            _counted(where, int(at[6]) if at[0] else 0, first + len(out[6:]))
            read_on = ReadResult(b"".join(out[6:]), now, False, where, offset)
            if read_on.data:
                _ends_at(where, bytes(read_on.data), now, offset)
        if cache is not None:
            cache[1].read_on = read_on
            return ColdStart(cache)
        return ColdStart(None, kept, read_on)

    def open_cache_parts(
        self, session_id: str, name: str, count: int
    ) -> Iterator[tuple[Head, CacheReader] | None]:
        """The parts `name#0` .. `name#<count - 1>`, read in one MULTI/EXEC; a part kept
        for another live log (another `gen`) is None."""
        h, c = (keys := self._keys(session_id))[0], keys[_CACHES]

        def run() -> list[Any]:
            pipe = self._client.pipeline(transaction=True)
            pipe.hget(h, "gen")
            for k in range(count):
                part = cache_part_name(name, k)
                pipe.hmget(c, [f"h:{part}", f"d:{part}"])
            return pipe.execute()  # type: ignore[no-any-return]

        if count <= 0:
            return
        gen, *parts = self._call("reading fold cache parts", run)
        for at, data in parts:
            fields = [] if at is None or data is None or gen is None else _text(at).split(" ")
            if _kept_at(fields, _text(gen)):
                yield _head_of(fields, self.where(session_id)), BytesCacheReader(bytes(data))
            else:
                yield None

    def store_cache(self, session_id: str, name: str, head: Head, data: list[bytes]) -> None:
        """Keep `data` under `name` at `head` (one script; nothing unless `head` is a
        point of the live log)."""
        pos = head.position
        if not isinstance(pos, RedisPosition) or head.seq == 0:
            return
        args = [
            name, pos.gen, head.seq, head.link, head.h, head.base_seq, pos.size, pos.n,
            b"".join(data),
        ]  # fmt: skip
        self._run("CACHE_STORE", session_id, args, f"saving a fold cache of {session_id!r}")

    keeps_cache_parts = True

    def remove_cache_parts(self, session_id: str, name: str, start: int) -> None:
        """Remove the caches kept under `name#k`, k >= `start` (one script)."""
        c = self._keys(session_id)[_CACHES]
        self._call(
            f"removing fold cache parts of {session_id!r}",
            lambda: self._script("CACHE_DROP_PARTS", [c], [name, start]),
        )

    # -- sessions -----------------------------------------------------------------------

    def _head_pattern(self) -> str:
        """The SCAN pattern of every session's head key (the prefix's glob characters
        escaped)."""
        return re.sub(r"([*?\[\]\\])", r"\\\1", self._prefix) + ":{*}:h"

    def list_sessions(self) -> list[str]:
        """Every session with a committed line: a SCAN of the head keys (cursor by
        cursor, so it never blocks the server), then each one's id."""
        pattern = self._head_pattern()

        def run() -> list[str]:
            found = list(self._client.scan_iter(match=pattern, count=1000))
            pipe = self._client.pipeline(transaction=False)
            for key in found:
                pipe.hmget(key, ["id", "seq"])
                pipe.exists(key[:-1] + b"a")
            out = pipe.execute()
            ids = []
            for (sid, seq), arch in zip(out[0::2], out[1::2], strict=True):
                if sid is not None and (int(seq or 0) > 0 or arch):
                    ids.append(sid.decode("utf-8"))
            return ids

        return sorted(self._call("listing sessions", run))

    # -- key slots (`KeyEngine`): one string key each, `<prefix>:keyslot:<data key id>`
    # (outside every session's hash tag, so no session scan sees it; never expires)

    def _slot_key(self, dk: str) -> str:
        return f"{self._prefix}:keyslot:{dk}"

    def _durable(self) -> None:
        if self._waitaof:
            self._call(
                "waiting for the AOF",
                lambda: self._client.execute_command("WAITAOF", 1, 0, _WAITAOF_MS),
            )

    def load_key_slot(self, dk: str) -> bytes | None:
        """The key slot `dk`."""
        found = self._call("reading a key slot", lambda: self._client.get(self._slot_key(dk)))
        return None if found is None else bytes(found)

    def create_key_slot(self, dk: str, data: bytes) -> bool:
        """Keep the key slot `dk` unless one exists (SET NX)."""
        key = self._slot_key(dk)
        made = bool(self._call("creating a key slot", lambda: self._client.set(key, data, nx=True)))
        if made:
            self._durable()
        return made

    def replace_key_slot(self, dk: str, data: bytes, expected: bytes | None = None) -> bool:
        """Replace the key slot `dk` (SET; with `expected`, a script: GET, compare, SET)."""
        key = self._slot_key(dk)
        if expected is None:
            self._call("replacing a key slot", lambda: self._client.set(key, data))
        elif not self._call(
            "replacing a key slot",
            lambda: self._client.eval(_REPLACE_IF_SAME, 1, key, expected, data),
        ):
            return False
        self._durable()
        return True

    def list_key_slots(self) -> list[str]:
        """Every key slot's id (a SCAN)."""
        base = f"{self._prefix}:keyslot:"
        pattern = re.sub(r"([*?\[\]\\])", r"\\\1", base) + "*"

        def run() -> list[str]:
            return [
                k.decode()[len(base) :] for k in self._client.scan_iter(match=pattern, count=1000)
            ]

        return sorted(self._call("listing key slots", run))

    def remove_key_slot(self, dk: str, data: bytes) -> bool:
        """Remove the key slot `dk` if it holds `data` (a script: GET, compare, DEL)."""
        key = self._slot_key(dk)
        gone = bool(
            self._call(
                "removing a key slot",
                lambda: self._client.eval(_REMOVE_IF_SAME, 1, key, data),
            )
        )
        if gone:
            self._durable()
        return gone

    # -- the session index (`IndexingEngine`): see `eventstore.engines.redis.scripts` ----

    def index_page(
        self,
        *,
        order: IndexOrder,
        after: IndexEntry | None,
        limit: int | None,
        prefix: str | None = None,
        updated_since_us: int | None = None,
        labels: dict[str, str] | None = None,
    ) -> list[IndexEntry]:
        """Members of the order's sorted set from just past the cursor (ZRANGEBYLEX,
        backwards for the times), each with its session's hash (one pipeline a chunk),
        filtered until the page is full. A member that is no longer its session's (the
        session removed, expired or written since: it stands further on now) is passed
        over; a page writes nothing (`replace_index`, a rebuild, drops such members)."""
        want = labels or {}
        field = {"updated": "up", "created": "cr", "id": ""}[order]
        zkey = self._ix_keys[("updated", "created", "id").index(order)]
        if order == "id":
            bound = b"-" if after is None else b"(" + after.session_id.encode()
            if prefix and (after is None or prefix > after.session_id):
                bound = b"[" + prefix.encode()
        else:
            bound = b"+"
            if after is not None:
                t = after.sort_key(order)[0]
                bound = b"(" + (scripts.ixkey(t) + after.session_id).encode()
        # a page unfiltered needs about `limit` members; a filtered one, more a round trip
        filtered = bool(want) or (prefix and order != "id") or updated_since_us is not None
        chunk = 500 if limit is None or filtered else min(limit + 8, 500)
        page: list[IndexEntry] = []
        while limit is None or len(page) < limit:
            members, found = self._call(
                "paging the session index",
                functools.partial(self._index_chunk, zkey, order, bound, chunk),
            )
            for member, of in zip(members, found, strict=True):
                if of is None:
                    continue  # (names no session: added from outside)
                sid, h = of
                if order == "id" and prefix and not sid.startswith(prefix):
                    return page  # past the ids that start with it
                if (
                    order == "updated"
                    and updated_since_us is not None
                    and (int(member[:14], 16) - scripts.IX_OFFSET < updated_since_us)
                ):
                    return page  # newest first: every later one is older
                entry = self._index_entry(sid, member, field, h)
                if entry is not None and index_matches(entry, prefix, updated_since_us, want):
                    page.append(entry)
                    if limit is not None and len(page) >= limit:
                        break
            if len(members) < chunk:
                break
            bound = b"(" + members[-1]
        return page

    _INDEX_FIELDS = ("id", "seq", "base", "size", "cr", "up", "lb")

    def _index_chunk(
        self, zkey: str, order: IndexOrder, bound: bytes, chunk: int
    ) -> tuple[list[bytes], list[tuple[str, list[Any]] | None]]:
        """Up to `chunk` members of `zkey` past `bound`, and each one's session id and
        hash (None: a member that names no session, `_member_sid`)."""
        if order == "id":
            members = self._client.zrangebylex(zkey, bound, b"+", 0, chunk)
        else:
            members = self._client.zrevrangebylex(zkey, bound, b"-", 0, chunk)
        sids = [_member_sid(member, order) for member in members]
        pipe = self._client.pipeline(transaction=False)
        for sid in sids:
            if sid is not None:
                pipe.hmget(self._keys(sid)[0], self._INDEX_FIELDS)
        hashes = iter(pipe.execute() if any(sid is not None for sid in sids) else [])
        return list(members), [None if sid is None else (sid, next(hashes)) for sid in sids]

    def _index_entry(self, sid: str, member: bytes, field: str, h: list[Any]) -> IndexEntry | None:
        """The entry a member stands for (None: a session with no committed line, or a
        member that is not the session's own any more, passed over: a page writes
        nothing, `rebuild_index` drops it)."""
        _, seq, base, size, cr, up, lb = h
        if cr is None:
            return None  # (the session expired or was removed)
        try:  # (fields edited from outside: a typed error naming the session)
            times = {"cr": int(cr), "up": int(up)}
            labels = _labels_decoder.decode(lb) if lb else {}
            last, first, size_ = int(seq or 0), int(base or 0), int(size or 0)
        except (ValueError, TypeError, msgspec.DecodeError, msgspec.ValidationError):
            raise _index_fields_edited(self.where(sid)) from None
        if not _own_member(member, sid, field, times) or last == 0:
            return None
        return IndexEntry(sid, times["cr"], times["up"], last, last - first + 1, size_, labels)

    def _tidy_index(self) -> None:
        """Drop every member of the index's sets that stands for no session any more
        (one expired or removed, or written since), each checked against its session
        again in the script that drops it (`INDEX_DROP`): a session written meanwhile
        keeps its own. A member whose session's times are not numbers is left (verify
        and the pages name that session)."""
        orders: tuple[tuple[IndexOrder, str], ...] = (
            ("updated", "up"), ("created", "cr"), ("id", ""),
        )  # fmt: skip
        for order, field in orders:
            zkey = self._zset_of(field)
            bound = b"-" if order == "id" else b"+"
            while True:
                members, found = self._call(
                    "reading the session index",
                    functools.partial(self._index_chunk, zkey, order, bound, 500),
                )
                for member, of in zip(members, found, strict=True):
                    if of is None:  # no session's own, now or ever: no check to make
                        self._call(
                            "tidying the session index",
                            functools.partial(self._client.zrem, zkey, member),
                        )
                        continue
                    sid, h = of
                    cr, up = h[4], h[5]
                    try:
                        times = None if cr is None else {"cr": int(cr), "up": int(up)}
                    except (ValueError, TypeError):
                        continue
                    if times is None or not _own_member(member, sid, field, times):
                        keys, args = [self._keys(sid)[0], zkey], [member, field, sid]
                        self._call(
                            "tidying the session index",
                            functools.partial(self._script, "INDEX_DROP", keys, args),
                        )
                if len(members) < 500:
                    break
                bound = b"(" + members[-1]

    def _zset_of(self, field: str) -> str:
        return self._ix_keys[{"up": 0, "cr": 1, "": 2}[field]]

    def index_stale(self) -> bool:
        """Whether the store may hold sessions the index lacks (written by a release
        without it): no version key, which a rebuild sets, and some session's head. A
        store with no session yet gets the key at once (the engine asks when it opens):
        one SCAN, up to the first head, once per store."""
        key = self._ix_version
        if self._call("reading the session index", lambda: self._client.exists(key)):
            return False
        pattern = self._head_pattern()

        def any_head() -> bool:
            return next(iter(self._client.scan_iter(match=pattern, count=1000)), None) is not None

        if self._call("reading the session index", any_head):
            return True
        if not self._create:
            return False  # a reader's store: a prefix it only reads gets no key from it
        self._call("marking the session index", lambda: self._client.set(key, 1, nx=True))
        return False

    def replace_index(self, entries: Sequence[IndexEntry], started_us: int) -> None:
        """A rebuild's entries, one script each (`INDEX_SET`, a pipeline of 500 a round
        trip): a session written since (a higher seq) keeps its own. Then the members
        standing for no session (expired, removed) are dropped (`_tidy_index`: pages
        pass over them and write nothing), then the version key."""
        for i in range(0, len(entries), 500):
            pipe = self._client.pipeline(transaction=False)
            for e in entries[i : i + 500]:
                args = [
                    e.last_seq, e.created_us, e.updated_us, msgspec.json.encode(e.labels),
                    e.session_id,
                ]  # fmt: skip
                self._scripts["INDEX_SET"](keys=self._keys(e.session_id), args=args, client=pipe)
            self._call("rebuilding the session index", pipe.execute, tries=1)
        self._tidy_index()
        self._call("rebuilding the session index", lambda: self._client.set(self._ix_version, 1))

    def remove_session(self, session_id: str) -> bool:
        """One script: every key of the session deleted at once."""
        return int(self._write("REMOVE", session_id, [], f"removing {session_id!r}")[0]) == 1

    def close(self) -> None:
        """Close the client's connections (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._client.close()
        except redis.RedisError:
            pass


class RedisFeedEngine(RedisEngine, FeedEngine):
    """The Redis engine with the global feed (the default; `feed=0` in the URL turns it
    off, and with it the one key outside each session's hash slot)."""

    def feed(
        self, after: RedisFeedPosition | None = FEED_START, limit: int = 1000
    ) -> list[RedisFeedEntry]:
        """Up to `limit` lines of every session after feed position `after`, in the order
        their appends ran on the server (stream ids: the server's clock, never going
        back). Lines of removed, expired or compacted sessions stay until the feed is
        trimmed (`feed_maxlen`). A position the trim passed (lines after it gone) gives
        the lines before the gap, then `HistoryUnavailableError`."""
        start = FEED_START if after is None else RedisFeedPosition(*after)
        out: list[RedisFeedEntry] = []
        lower = f"{start.ms}-{start.sq}"
        # the last entry read (from the start: none, the oldest kept comes first)
        seen = None if start <= FEED_START else (start.ms, start.sq)
        while len(out) < limit:
            entries = self._call("reading the feed", functools.partial(self._xrange, lower))
            if not entries:
                break
            for eid, fields in entries:
                ms, sq = (int(x) for x in eid.split(b"-"))
                before = fields.get(b"p")  # (none in an entry of a release before it)
                if seen and before and tuple(int(x) for x in before.split(b"-")) > seen:
                    return self._trimmed(out, start, _text(eid))
                seen = (ms, sq)
                sid, first = fields[b"s"].decode("utf-8"), int(fields[b"q"])
                for i, line in enumerate(fields[b"d"].split(b"\n")[:-1]):
                    pos = RedisFeedPosition(ms, sq, i)
                    if pos > start and len(out) < limit:
                        out.append(RedisFeedEntry(pos, sid, first + i, line + b"\n"))
            lower = "(" + _text(entries[-1][0])
        return out

    def _trimmed(
        self, out: list[RedisFeedEntry], start: RedisFeedPosition, kept: str
    ) -> list[RedisFeedEntry]:
        """The lines read before a gap the feed's trim left; none: the gap is right after
        `start`, which `HistoryUnavailableError` says."""
        if out:
            return out
        raise HistoryUnavailableError(
            f"{self.url}: the global feed was trimmed past position {tuple(start)}"
            f" (feed_maxlen): lines after it are gone, the next kept is at {kept};"
            " read from the start (what the feed keeps) and resync what was missed"
        )

    def _xrange(self, lower: str) -> list[Any]:
        return list(self._client.xrange(self._feed_key, lower, "+", count=100))


class _RedisRepairHold(RepairHold):
    """The hold key held; the live log read once."""

    def __init__(self, engine: RedisEngine, sid: str, keys: list[str], token: str) -> None:
        self.engine = engine
        self.session_id = sid
        self.where = engine.where(sid)
        self._keys = keys
        self._token = token

        def run() -> list[Any]:
            pipe = engine._client.pipeline(transaction=True)
            pipe.lrange(keys[1], 0, -1)
            pipe.hmget(keys[0], ["tail", "gen", "n", "seq", "hh", "link", "size"])
            return pipe.execute()  # type: ignore[no-any-return]

        items, (tail, gen, n, seq, hh, link, size) = engine._call(
            "reading a session for repair", run
        )
        self._exists = gen is not None
        self._data = b"".join(items) + (tail or b"")
        self._head_end: int | None = None
        count = _count_of(self.where, n) if gen is not None else 0
        try:
            _counted(self.where, count, len(items))
        except CorruptLogError as exc:
            # batches pushed past a head whose own batches end at its line, and whose
            # size is theirs: the head is right, the rest is cut (saved aside); any
            # other disagreement (batches lost, the head or its count edited: a head
            # taken back to an older line but whose size still counts the whole list)
            # cannot be told apart: nothing is cut
            ours = b"".join(items[:count])
            last = last_line_end(ours) if 0 < count < len(items) else None
            if last is None or (str(last.seq), last.h, last.link, str(len(ours))) != (
                _text(seq),
                _text(hh),
                _text(link),
                _text(size),
            ):
                raise head_disputed(self.where, None, exc.reason) from None
            self._head_end = len(ours)

    @property
    def head_end(self) -> int | None:
        return self._head_end

    @property
    def data(self) -> bytes:
        return self._data

    def keep_prefix(self, n: int, reason: str) -> str | None:
        if n >= len(self._data):
            return None
        return self.rewrite(self._data[:n], reason)

    def rewrite(self, data: bytes, reason: str) -> str:
        if not self._exists:
            raise KeyError(f"{self.where}: no live log to rewrite")
        end = raw_end(data)
        cut = end.end if end is not None else 0
        args = [
            self._token, os.urandom(8).hex(), data[:cut], data[cut:],
            end.seq if end else 0, end.link if end else "", end.h if end else "",
            end.first_seq if end else 0, self.session_id, self.engine._ttl,
        ]  # fmt: skip
        out = self.engine._call(
            "rewriting a session",
            lambda: self.engine._script("REWRITE", self._keys, args),
        )
        if int(out[0]) == 3:
            raise StorageError(f"{self.where}: the repair hold expired before the rewrite")
        if int(out[0]) == 4:
            raise StorageError(
                f"{self.where}: the session expired (or its head was deleted) while the"
                " repair held it: nothing written"
            )
        self._data = data
        return f"{self.where}/saved/{int(out[1])}-{reason}"
