"""The PostgreSQL engine (extra `[postgres]`: `pip install -e '.[postgres]'` from a
checkout, `harness-eventstore[postgres]` from an index). Its names are imported on first
use, so the package can be named without psycopg installed."""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "PostgresEngine": "eventstore.engines.postgres.engine",
    "FeedBlocker": "eventstore.engines.postgres.engine",
    "FeedEntry": "eventstore.engines.postgres.engine",
    "FeedPosition": "eventstore.engines.postgres.engine",
    "init_db": "eventstore.engines.postgres.engine",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
