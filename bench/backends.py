"""The backends the benchmark compares, by name, and how to open each one.

Durability classes: "flush" (survives a killed process: eventstore flush, sqlite and
eventsourcing with `synchronous=NORMAL`, the rewrite design) and "fsync" (survives
power loss: eventstore fsync, sqlite and eventsourcing with `synchronous=FULL`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from .workload import SessionBackend

__all__ = ["BACKENDS", "Backend", "available", "open_backend"]


@dataclass(frozen=True, slots=True)
class Backend:
    """A named way to open a session store at a root directory."""

    name: str
    durability: str
    opener: Callable[[str], SessionBackend]
    needs: str | None = None  # an optional package the backend imports


def _eventstore(durability: str) -> Callable[[str], SessionBackend]:
    def open_(root: str) -> SessionBackend:
        from eventstore import SessionStore

        return SessionStore(root, durability=durability)  # type: ignore[arg-type,return-value]

    return open_


def _rewrite(root: str) -> SessionBackend:
    from .baselines.rewrite_json import RewriteJsonStore

    return RewriteJsonStore(root)


def _sqlite(sync: str) -> Callable[[str], SessionBackend]:
    def open_(root: str) -> SessionBackend:
        from .baselines.sqlite_rows import SqliteRowsStore

        return SqliteRowsStore(root, synchronous=sync)

    return open_


def _es(sync: str) -> Callable[[str], SessionBackend]:
    def open_(root: str) -> SessionBackend:
        from .baselines.eventsourcing_backend import EventsourcingStore

        return EventsourcingStore(root, synchronous=sync)

    return open_


BACKENDS: dict[str, Backend] = {
    b.name: b
    for b in (
        Backend("eventstore-flush", "flush", _eventstore("flush")),
        Backend("eventstore-fsync", "fsync", _eventstore("fsync")),
        Backend("rewrite-json", "flush", _rewrite),
        Backend("sqlite-normal", "flush", _sqlite("NORMAL")),
        Backend("sqlite-full", "fsync", _sqlite("FULL")),
        Backend("eventsourcing-normal", "flush", _es("NORMAL"), needs="eventsourcing"),
        Backend("eventsourcing-full", "fsync", _es("FULL"), needs="eventsourcing"),
    )
}


def available(name: str) -> bool:
    """False when the backend needs a package that is not installed."""
    needs = BACKENDS[name].needs
    if needs is None:
        return True
    import importlib.util

    return importlib.util.find_spec(needs) is not None


def open_backend(name: str, root: str | os.PathLike[str]) -> SessionBackend:
    """Open backend `name` at `root`."""
    return BACKENDS[name].opener(os.fspath(root))
