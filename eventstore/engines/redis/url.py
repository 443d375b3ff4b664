"""Store URLs of the Redis engine: parsing them into the client's URL and the engine's
own options, without importing the `redis` package (so a URL can be checked and shown
without the `[redis]` extra).

    redis://[[user]:password@]host[:port][/db][?param=value...]
    rediss://...                         TLS
    unix:///path/to/redis.sock[?db=N&...]

The engine's own parameters, taken out before the rest goes to the client
(`redis.from_url`: `client_name`, `socket_timeout`, `ssl_cert_reqs`, ...):

    prefix=NAME        the key prefix (default `eventstore`): stores side by side on one
                       server; letters, digits and `._-`, at most 64
    ttl=SECONDS        expire an idle session: every write sets all of its keys to
                       expire SECONDS later (default: never); 1 to MAX_TTL_SECONDS
    feed=0             keep no global feed (then every write touches one hash slot only)
    feed_maxlen=N      trim the global feed to about N batches (default: kept whole)
"""

from __future__ import annotations

import math
import re
from urllib.parse import parse_qsl, quote, urlencode, urlsplit

import msgspec

from eventstore.engines.base import redact_url
from eventstore.errors import InvalidArgumentError

__all__ = ["DEFAULT_PREFIX", "MAX_TTL_SECONDS", "RedisUrl", "split_url", "ttl_ms"]

DEFAULT_PREFIX = "eventstore"
SCHEMES = ("redis", "rediss", "unix")
_PREFIX = re.compile(r"[A-Za-z0-9._-]{1,64}")
# the longest `ttl=` (about 317 years): the scripts' deadline (the server's clock in ms
# plus the ttl) stays a whole number that Lua holds exactly and the server's PEXPIREAT
# takes; past about 10**14 seconds it took none, after the append had landed
MAX_TTL_SECONDS = 10**10


class RedisUrl(msgspec.Struct, frozen=True):
    """A parsed store URL: `client` (what `redis.from_url` opens), `shown` (the URL with
    its password as `***`), `password` (to scrub from messages; "" for none) and the
    engine's options."""

    client: str
    shown: str
    password: str
    prefix: str = DEFAULT_PREFIX
    ttl_ms: int = 0
    feed: bool = True
    feed_maxlen: int = 0


def _int_param(name: str, value: str, shown: str, least: int) -> int:
    try:
        n = int(value)
    except ValueError:
        n = least - 1
    if n < least:
        raise InvalidArgumentError(f"{shown}: {name}={value!r} is not a whole number >= {least}")
    return n


def ttl_ms(seconds: object, shown: str) -> int:
    """`ttl=` (seconds, an int or a float) in milliseconds, or InvalidArgumentError
    naming the store (`shown`): from a millisecond (less is 0 ms, which the scripts
    read as no expiry at all) to `MAX_TTL_SECONDS`; no bool, NaN or infinity."""
    if (
        not isinstance(seconds, int | float)
        or isinstance(seconds, bool)
        or not math.isfinite(seconds)
        or not 0.001 <= seconds <= MAX_TTL_SECONDS
    ):
        raise InvalidArgumentError(
            f"{shown}: ttl must be a number of seconds from 0.001 to {MAX_TTL_SECONDS},"
            f" not {seconds!r}"
        )
    return max(1, int(seconds * 1000))


def split_url(url: str) -> RedisUrl:
    """The client URL and the engine's options of a store URL; `InvalidArgumentError`
    (naming the URL with its password hidden) for one that is not a Redis store URL."""
    shown = redact_url(url)
    try:
        parts = urlsplit(url)
        password = parts.password or ""
        pairs = parse_qsl(parts.query, keep_blank_values=True)
    except ValueError:
        raise InvalidArgumentError(f"not a Redis URL: {shown}") from None
    if parts.scheme not in SCHEMES:
        raise InvalidArgumentError(f"not a Redis URL (redis://, rediss://, unix://): {shown}")
    opts: dict[str, object] = {}
    kept: list[tuple[str, str]] = []
    for k, v in pairs:
        if k == "password":
            password = v
        if k == "prefix":
            if not _PREFIX.fullmatch(v):
                raise InvalidArgumentError(
                    f"{shown}: prefix={v!r}: letters, digits and ._- only, 1 to 64 of them"
                )
            opts["prefix"] = v
        elif k == "ttl":
            opts["ttl_ms"] = ttl_ms(_int_param("ttl", v, shown, 1), shown)
        elif k == "feed":
            if v not in ("0", "1"):
                raise InvalidArgumentError(f"{shown}: feed={v!r} is not 0 or 1")
            opts["feed"] = v == "1"
        elif k == "feed_maxlen":
            opts["feed_maxlen"] = _int_param("feed_maxlen", v, shown, 1)
        else:
            kept.append((k, v))
    query = urlencode(kept, quote_via=quote)
    # (not urlunsplit: it writes `unix:/path` for an empty authority, which the client refuses)
    client = f"{parts.scheme}://{parts.netloc}{parts.path}" + (f"?{query}" if query else "")
    return RedisUrl(client, shown, password, **opts)  # type: ignore[arg-type]
