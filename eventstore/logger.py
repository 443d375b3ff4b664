"""The library's logger, `logging.getLogger("eventstore")`, with `logging` imported when
something is first logged: importing it (and `traceback`, which it imports) costs a fresh
process about 5 ms, and most processes never log. Configure the logger as any other:
`logging.getLogger("eventstore")` is the object `log` hands its calls to."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    import logging

__all__ = ["DEBUG", "INFO", "WARNING", "log"]

# `logging`'s levels (fixed by its documentation), for callers that pass one
DEBUG, INFO, WARNING = 10, 20, 30


class _Deferred:
    """Stands in for the logger: its first use of each method imports `logging` and
    keeps the logger's bound method, so later calls go straight to it."""

    def __getattr__(self, name: str) -> Any:
        import logging

        value = getattr(logging.getLogger("eventstore"), name)
        if callable(value):  # (a level or a flag may change: only methods are kept)
            setattr(self, name, value)
        return value


log = cast("logging.Logger", _Deferred())
"""`logging.getLogger("eventstore")`, imported on first use."""
