"""The Redis engine (extra `[redis]`: `pip install -e '.[redis]'` from a checkout,
`harness-eventstore[redis]` from an index). Its names are imported on first use, so the
package can be named without the `redis` client installed; `url` imports nothing of it."""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    name: "eventstore.engines.redis.engine"
    for name in (
        "FEED_START",
        "RedisDurabilityError",
        "RedisEngine",
        "RedisFeedEngine",
        "RedisFeedEntry",
        "RedisFeedPosition",
        "RedisPosition",
    )
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
