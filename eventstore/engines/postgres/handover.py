"""The connection a PostgreSQL engine opens first, handed to its pool.

An engine opens one connection of its own before anything else, to check (or create)
its schema: opened directly, a wrong URL or password fails at once with the server's own
words, where a pool would retry until its timeout. That connection is then not closed
but given to the pool as the pool's first (`Handover`, through the pool's documented
`connection_class`): a store opened for one load starts one server session, not two,
and its first statements run on a backend that is already up, instead of waiting for
the pool to connect a second one.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Self

if TYPE_CHECKING:  # imported when a class is made: the engine imports it first, with
    import psycopg  # the install hint when the extra is missing

__all__ = ["Handover"]


class Handover:
    """One connection waiting for a pool (`give`), taken by the pool's first connect
    (`connection_class`); never by a forked child, whose parent's connection it is.
    `set_up`, when given, runs on every connection `connection_class` opens, once."""

    def __init__(self, set_up: Callable[[psycopg.Connection[Any]], None] | None = None) -> None:
        self.set_up = set_up
        self._conn: psycopg.Connection[Any] | None = None
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self.connection_class = _class_taking_from(self)

    def give(self, conn: psycopg.Connection[Any]) -> None:
        """Keep `conn` (made by `connection_class.connect`) for the pool's first connect."""
        with self._lock:
            self._conn = conn

    def take(self) -> psycopg.Connection[Any] | None:
        """The connection given, once; None after that, or in another process."""
        with self._lock:
            if os.getpid() != self._pid:
                return None
            conn, self._conn = self._conn, None
        return conn

    def close(self) -> None:
        """Close the connection if no pool took it (an engine closed at once)."""
        conn = self.take()
        if conn is not None:
            conn.close()


def _class_taking_from(handover: Handover) -> type[psycopg.Connection[Any]]:
    """A `psycopg.Connection` class whose `connect` returns `handover`'s connection when
    it holds one (the pool calls `connection_class.connect` for each connection)."""
    import psycopg

    class HandedOver(psycopg.Connection[Any]):
        @classmethod
        def connect(cls, conninfo: str = "", **kwargs: Any) -> Self:
            conn = handover.take()
            if isinstance(conn, cls):
                return conn  # (set up when it was opened)
            opened = super().connect(conninfo, **kwargs)
            if handover.set_up is not None:
                try:
                    handover.set_up(opened)
                except BaseException:
                    opened.close()
                    raise
            return opened

    return HandedOver
