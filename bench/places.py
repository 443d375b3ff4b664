"""Where one run of an integration bench keeps its data, on each engine: always a fresh
directory (the SQLite rivals' files, and eventstore's on the file engine), and on a
server a fresh PostgreSQL schema or Redis key prefix, which both eventstore and the
framework's own backend on that server work in. Everything is removed after the run.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

__all__ = ["ENGINES", "Place", "drop_keys", "drop_schema", "place", "with_prefix", "with_schema"]

ENGINES = ("file", "postgres", "redis")


class Place(NamedTuple):
    """One run's room. `store`: what `SessionStore` opens (the directory, or the server's
    URL with eventstore's `schema=` or `prefix=`); `server`: the server's URL as given
    (None on files); `ns`: the schema or key prefix (empty on files)."""

    engine: str
    dir: Path
    store: str
    server: str | None
    ns: str


def _with_option(url: str, key: str, value: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}{key}={value}"


def with_schema(url: str, schema: str) -> str:
    """A PostgreSQL store URL whose store lives in `schema`."""
    return _with_option(url, "schema", schema)


def with_prefix(url: str, prefix: str) -> str:
    """A Redis store URL whose keys start with `prefix`."""
    return _with_option(url, "prefix", prefix)


@contextlib.contextmanager
def place(engine: str, url: str | None) -> Iterator[Place]:
    """A fresh `Place` on `engine` (`url`: the PostgreSQL database or Redis server)."""
    root = Path(tempfile.mkdtemp(prefix="eventstore-bench-"))
    ns = f"bench_{uuid.uuid4().hex[:10]}" if engine != "file" else ""
    try:
        if engine == "file":
            yield Place(engine, root, str(root), None, ns)
        elif engine == "postgres":
            assert url is not None
            with _schema(url, ns):
                yield Place(engine, root, with_schema(url, ns), url, ns)
        elif engine == "redis":
            assert url is not None
            try:
                yield Place(engine, root, with_prefix(url, ns), url, ns)
            finally:
                drop_keys(url, ns)
        else:
            raise ValueError(f"no engine {engine!r} (one of {', '.join(ENGINES)})")
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def _schema(url: str, schema: str) -> Iterator[None]:
    import psycopg

    from eventstore.engines.postgres.url import split_url

    conninfo = split_url(url)[0]
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield
    finally:
        drop_schema(url, schema)


def drop_schema(url: str, schema: str) -> None:
    """Drop `schema` of the PostgreSQL database at `url`, with all it holds."""
    import psycopg

    from eventstore.engines.postgres.url import split_url

    with psycopg.connect(split_url(url)[0], autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def drop_keys(url: str, prefix: str) -> None:
    """Delete every key of the Redis server at `url` that starts with `prefix`."""
    import redis

    client = redis.Redis.from_url(url.split("?")[0])
    try:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        for i in range(0, len(keys), 500):
            client.delete(*keys[i : i + 500])
    finally:
        client.close()
