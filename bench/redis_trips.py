"""Redis round trips counted on the client: every command redis-py sends by itself, and
each pipeline as one (`PIPELINE`); commands inside a Lua script are not round trips.
Shared by the round-trip benches (`bench.adk_round_trips`, `bench.adapter_round_trips`)."""

from __future__ import annotations

import collections
import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

from bench import server_url
from bench.places import drop_keys, with_prefix


@contextlib.contextmanager
def counted() -> Iterator[collections.Counter[str]]:
    """Count the round trips of every Redis client while inside, by command name."""
    import redis
    import redis.client

    sent: collections.Counter[str] = collections.Counter()
    command, execute = redis.Redis.execute_command, redis.client.Pipeline.execute

    def one(self: Any, *args: Any, **kw: Any) -> Any:
        sent[str(args[0]).upper()] += 1
        return command(self, *args, **kw)

    def pipeline(self: Any, *args: Any, **kw: Any) -> Any:
        sent["PIPELINE"] += 1
        return execute(self, *args, **kw)

    redis.Redis.execute_command = one  # type: ignore[method-assign]
    redis.client.Pipeline.execute = pipeline  # type: ignore[method-assign]
    try:
        yield sent
    finally:
        redis.Redis.execute_command = command  # type: ignore[method-assign]
        redis.client.Pipeline.execute = execute  # type: ignore[method-assign]


@contextlib.contextmanager
def fresh_prefix(url: str, name: str) -> Iterator[str]:
    """`url` with a key prefix of its own (`name` and a random tail); its keys are
    deleted on leaving."""
    prefix = f"{name}{uuid.uuid4().hex[:8]}"
    try:
        yield with_prefix(url, prefix)
    finally:
        drop_keys(url, prefix)


def per_op(sent: collections.Counter[str], ops: int) -> str:
    """The counts, their total and the total per operation, as one line."""
    total = sum(sent.values())
    return f"{dict(sent)} ({total} in all, {total / ops:g} each)"


def redis_url(parser: Any, given: str | None) -> str:
    """The Redis server to use (`bench.server_url`)."""
    return server_url(parser, given, "REDIS")
