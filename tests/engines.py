"""The engines the conformance suite and the model test run on: one entry per engine.

An engine joins by adding an `EngineCase` to `ENGINES`: how to get a URL of a fresh,
empty store, whether several processes can share that store, and how a test rewrites a
session's raw live log (to play an attacker or a bad tool). The PostgreSQL entry runs
when `EVENTSTORE_TEST_POSTGRES_URL` names a server, the Redis entry when
`EVENTSTORE_TEST_REDIS_URL` does.
"""

from __future__ import annotations

import atexit
import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from eventstore import SessionStore
from eventstore.engines.base import (
    EncodedBatch,
    Engine,
    Head,
    History,
    InstallResult,
    Position,
    ReadResult,
    RepairHold,
    SeqEngine,
)
from eventstore.engines.conformance import corrupt
from eventstore.engines.file.engine import FileEngine
from eventstore.engines.file.layout import SessionPaths
from eventstore.engines.memory import MemoryEngine

Rewrite = Callable[[bytes], bytes]


@dataclass(frozen=True)
class EngineCase:
    """One engine as the tests see it.

    `fresh(tmp_path)`: the URL of a new, empty store (called once per test; a second
    `SessionStore` on the same URL sees the same sessions). `processes`: whether stores
    in several processes share that URL's sessions. `rewrite(store, sid, fn)`: replace
    the session's live log bytes `b` by `fn(b)`, bypassing every check.
    """

    name: str
    fresh: Callable[[Path], str]
    processes: bool
    rewrite: Callable[[SessionStore, str, Rewrite], None]


def _rewrite_file(store: SessionStore, sid: str, fn: Rewrite) -> None:
    assert isinstance(store.engine, FileEngine)
    path = SessionPaths(store.engine.root, sid).log
    path.write_bytes(fn(path.read_bytes()))


def _rewrite_held(store: SessionStore, sid: str, fn: Rewrite) -> None:
    """Through the engine's repair hold (`eventstore.engines.conformance.corrupt`)."""
    corrupt(store.engine, sid, fn)


ENGINES: list[EngineCase] = [
    EngineCase("file", lambda tmp: str(tmp / "store"), True, _rewrite_file),
    EngineCase("memory", lambda tmp: f"memory://test-{uuid.uuid4().hex}", False, _rewrite_held),
]

# a PostgreSQL entry goes here, appended only when this names a server to test against
POSTGRES_URL = os.environ.get("EVENTSTORE_TEST_POSTGRES_URL")

_pg_schemas: list[str] = []


def fresh_postgres(tmp: Path) -> str:
    """A URL of a schema of its own on the test server (dropped when the run ends)."""
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

    assert POSTGRES_URL is not None
    schema = f"t_{uuid.uuid4().hex[:12]}"
    if not _pg_schemas:
        atexit.register(_drop_postgres_schemas)
    _pg_schemas.append(schema)
    parts = urlsplit(POSTGRES_URL)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "schema"] + [("schema", schema)]
    return urlunsplit(parts._replace(query=urlencode(query)))


def _drop_postgres_schemas() -> None:
    import psycopg

    from eventstore.engines.postgres.url import split_url

    assert POSTGRES_URL is not None
    with psycopg.connect(split_url(POSTGRES_URL)[0], autocommit=True) as conn:
        for schema in _pg_schemas:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


if POSTGRES_URL:
    ENGINES.append(EngineCase("postgres", fresh_postgres, True, _rewrite_held))

# a Redis entry, likewise: each store a key prefix of its own on the test server
REDIS_URL = os.environ.get("EVENTSTORE_TEST_REDIS_URL")

_redis_prefixes: list[str] = []


def fresh_redis(tmp: Path | None = None, **params: str) -> str:
    """A URL of a key prefix of its own on the test Redis server (its keys are deleted
    when the run ends), with `params` added to its query."""
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

    assert REDIS_URL is not None
    prefix = f"t{uuid.uuid4().hex[:12]}"
    if not _redis_prefixes:
        atexit.register(_drop_redis_prefixes)
    _redis_prefixes.append(prefix)
    parts = urlsplit(REDIS_URL)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "prefix"]
    query += [("prefix", prefix), *params.items()]
    return urlunsplit(parts._replace(query=urlencode(query)))


def _drop_redis_prefixes() -> None:
    try:
        import redis
    except ImportError:
        return
    assert REDIS_URL is not None
    try:
        client = redis.Redis.from_url(REDIS_URL)
        for prefix in _redis_prefixes:
            keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
            for i in range(0, len(keys), 500):
                client.delete(*keys[i : i + 500])
        client.close()
    except redis.RedisError:
        pass  # the server is gone: nothing to clean


if REDIS_URL:
    ENGINES.append(EngineCase("redis", fresh_redis, True, _rewrite_held))

ENGINE_IDS = [case.name for case in ENGINES]


class WholeLogsOnly(Engine):
    """An engine that reads whole logs only (no `RangedEngine`): a memory engine's
    required contract, and nothing else."""

    def __init__(self, inner: MemoryEngine) -> None:
        self.inner, self.url = inner, inner.url

    def read(self, session_id: str, position: Position | None) -> ReadResult:
        return self.inner.read(session_id, position)

    def head(self, session_id: str) -> Head:
        return self.inner.head(session_id)

    def history(self, session_id: str) -> History:
        return self.inner.history(session_id)

    def wait(self, session_id: str, position: Position | None, timeout: float) -> bool:
        return self.inner.wait(session_id, position, timeout)

    def append(self, session_id: str, batch: EncodedBatch, expected: Head) -> Head:
        return self.inner.append(session_id, batch, expected)

    def install_snapshot(
        self, session_id: str, line: bytes, covers: Head, *, keep_history: bool
    ) -> InstallResult:
        return self.inner.install_snapshot(session_id, line, covers, keep_history=keep_history)

    def hold(self, session_id: str) -> AbstractContextManager[RepairHold]:
        return self.inner.hold(session_id)

    def list_sessions(self) -> list[str]:
        return self.inner.list_sessions()

    def remove_session(self, session_id: str) -> bool:
        return self.inner.remove_session(session_id)

    def close(self) -> None:
        self.inner.close()


def after_each_read_of_the_end(
    store: SessionStore, monkeypatch: pytest.MonkeyPatch, then: Callable[[], None]
) -> None:
    """Call `then()` right after each read of a log's end by `store`'s engine: its
    `tail` on an engine that reads lines by seq (PostgreSQL, Redis), on leaving a view of
    the live log on one that reads byte ranges (files, memory). Where a race between a
    reader of a log's end and another writer is staged."""
    engine: Any = store.engine
    if isinstance(engine, SeqEngine):
        real_tail = engine.tail

        def tail(session_id: str, count: int) -> Any:
            got = real_tail(session_id, count)
            then()
            return got

        monkeypatch.setattr(engine, "tail", tail)
        return
    real_view = engine.live_view

    @contextmanager
    def live_view(session_id: str) -> Iterator[Any]:
        with real_view(session_id) as view:
            yield view
        then()

    monkeypatch.setattr(engine, "live_view", live_view)
