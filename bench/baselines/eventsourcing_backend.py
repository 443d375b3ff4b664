"""The `eventsourcing` library (PyPI) with its SQLite persistence.

One aggregate per session (id: UUID5 of the session id), one event per operation;
payloads are the records as JSON builtins. The application keeps an aggregate cache
with fast-forward and without deep copies (the library's fastest configuration for a
long-lived process); a fresh process replays every event of the aggregate. The
library's SQLite module uses WAL; `synchronous` is set on every connection it opens
("NORMAL" ~ eventstore's "flush", "FULL" ~ "fsync").

Importing this module needs `eventsourcing`; `AVAILABLE` says whether it is installed.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any
from uuid import NAMESPACE_URL, UUID, uuid5

import msgspec

from eventstore.errors import FeatureNotFoundError
from eventstore.records import (
    BootstrapState,
    FeatureRecord,
    Message,
    ProgressEntry,
    RunCheckpoint,
    SessionManifest,
)

try:
    from eventsourcing.application import AggregateNotFoundError, Application
    from eventsourcing.domain import Aggregate, event
    from eventsourcing.persistence import IntegrityError
    from eventsourcing.sqlite import SQLiteConnectionPool

    AVAILABLE = True
except ImportError:  # pragma: no cover - exercised only without the library
    AVAILABLE = False

__all__ = ["AVAILABLE", "EventsourcingStore"]

_NS = uuid5(NAMESPACE_URL, "eventstore-bench")
_synchronous = "NORMAL"


def _b(value: Any) -> Any:
    return msgspec.to_builtins(value)


if AVAILABLE:
    _orig_create_connection = SQLiteConnectionPool._create_connection

    def _create_connection(self: SQLiteConnectionPool) -> Any:
        conn = _orig_create_connection(self)
        conn._sqlite_conn.execute(f"PRAGMA synchronous={_synchronous}")
        return conn

    SQLiteConnectionPool._create_connection = _create_connection  # type: ignore[method-assign]

    class SessionAggregate(Aggregate):
        """A session: bootstrap fields and the transcript, as JSON builtins."""

        @staticmethod
        def create_id(session_id: str, **_: Any) -> UUID:  # type: ignore[override]
            return uuid5(_NS, session_id)

        @event("Initialized")
        def __init__(
            self,
            session_id: str,
            manifest: dict[str, Any],
            features: list[dict[str, Any]],
            progress: list[dict[str, Any]],
            checkpoints: list[dict[str, Any]],
        ) -> None:
            self.session_id = session_id
            self.manifest: dict[str, Any] | None = manifest
            self.features = features
            self.progress = progress
            self.checkpoints = checkpoints
            self.transcript: list[dict[str, Any]] = []

        @event("ManifestSaved")
        def save_manifest(self, manifest: dict[str, Any]) -> None:
            self.manifest = manifest

        @event("ProgressAppended")
        def append_progress(self, entry: dict[str, Any]) -> None:
            self.progress.append(entry)

        @event("FeatureListReplaced")
        def replace_features(self, features: list[dict[str, Any]]) -> None:
            self.features = features

        @event("FeaturePassUpdated")
        def update_pass(self, feature_id: str, passes: bool) -> None:
            self.features = [
                {**f, "passes": passes} if f["id"] == feature_id else f for f in self.features
            ]

        @event("CheckpointRecorded")
        def record_checkpoint(self, checkpoint: dict[str, Any]) -> None:
            self.checkpoints.append(checkpoint)

        @event("MessagesAppended")
        def append_messages(self, messages: list[dict[str, Any]]) -> None:
            self.transcript.extend(messages)

    class SessionsApp(Application[UUID]):
        """The eventsourcing application holding every session aggregate."""


class EventsourcingStore:
    """The session API over an eventsourcing `Application` in `root/es.db`."""

    def __init__(self, root: str | os.PathLike[str], synchronous: str = "NORMAL") -> None:
        if not AVAILABLE:
            raise RuntimeError("the eventsourcing library is not installed")
        global _synchronous
        _synchronous = synchronous
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.app = SessionsApp(
            env={
                "PERSISTENCE_MODULE": "eventsourcing.sqlite",
                "SQLITE_DBNAME": str(self.root / "es.db"),
                "AGGREGATE_CACHE_MAXSIZE": "64",
                "DEEPCOPY_FROM_AGGREGATE_CACHE": "n",
            }
        )

    def close(self) -> None:
        """Close the application's connections."""
        self.app.close()

    def _get(self, session_id: str) -> SessionAggregate | None:
        try:
            return self.app.repository.get(uuid5(_NS, session_id))  # type: ignore[no-any-return]
        except AggregateNotFoundError:
            return None

    def _agg(self, session_id: str) -> SessionAggregate:
        agg = self._get(session_id)
        if agg is None:  # a write to a session never initialized: start it empty
            agg = SessionAggregate(
                session_id=session_id, manifest=None, features=[], progress=[], checkpoints=[]
            )
        return agg

    # -- the session API --------------------------------------------------------------

    def is_initialized(self, session_id: str) -> bool:
        """True once the session has a manifest."""
        agg = self._get(session_id)
        return agg is not None and agg.manifest is not None

    def initialize_session_if_missing(
        self,
        session_id: str,
        manifest: SessionManifest,
        feature_list: list[FeatureRecord],
        initial_progress_entry: ProgressEntry | None = None,
        initial_checkpoint: RunCheckpoint | None = None,
    ) -> bool:
        """One `Initialized` event; False if the session exists (or a racer won)."""
        existing = self._get(session_id)
        if existing is not None:
            if existing.manifest is not None:
                return False
            existing.save_manifest(_b(manifest))
            existing.replace_features(_b(list(feature_list)))
            if initial_progress_entry is not None:
                existing.append_progress(_b(initial_progress_entry))
            if initial_checkpoint is not None:
                existing.record_checkpoint(_b(initial_checkpoint))
            agg = existing
        else:
            agg = SessionAggregate(
                session_id=session_id,
                manifest=_b(manifest),
                features=_b(list(feature_list)),
                progress=[_b(initial_progress_entry)] if initial_progress_entry else [],
                checkpoints=[_b(initial_checkpoint)] if initial_checkpoint else [],
            )
        try:
            self.app.save(agg)
        except (IntegrityError, sqlite3.IntegrityError):
            return False
        return True

    def load_bootstrap_state(self, session_id: str) -> BootstrapState:
        """Rebuild (or fast-forward) the aggregate, then convert its fields."""
        agg = self._get(session_id)
        if agg is None:
            return BootstrapState()
        return msgspec.convert(
            {
                "manifest": agg.manifest,
                "feature_list": agg.features,
                "recent_progress": agg.progress,
                "checkpoints": agg.checkpoints,
            },
            BootstrapState,
        )

    def save_manifest(self, session_id: str, manifest: SessionManifest) -> None:
        """One `ManifestSaved` event."""
        agg = self._agg(session_id)
        agg.save_manifest(_b(manifest))
        self.app.save(agg)

    def append_progress_entry(self, session_id: str, entry: ProgressEntry) -> None:
        """One `ProgressAppended` event."""
        agg = self._agg(session_id)
        agg.append_progress(_b(entry))
        self.app.save(agg)

    def replace_feature_list(self, session_id: str, features: list[FeatureRecord]) -> None:
        """One `FeatureListReplaced` event."""
        agg = self._agg(session_id)
        agg.replace_features(_b(list(features)))
        self.app.save(agg)

    def update_feature_pass(self, session_id: str, feature_id: str, passes: bool) -> None:
        """One `FeaturePassUpdated` event; FeatureNotFoundError (nothing saved) if unknown."""
        agg = self._agg(session_id)
        if not any(f["id"] == feature_id for f in agg.features):
            raise FeatureNotFoundError(session_id, feature_id)
        agg.update_pass(feature_id, passes)
        self.app.save(agg)

    def record_run_checkpoint(self, session_id: str, checkpoint: RunCheckpoint) -> None:
        """One `CheckpointRecorded` event."""
        agg = self._agg(session_id)
        agg.record_checkpoint(_b(checkpoint))
        self.app.save(agg)

    def load_transcript_messages(self, session_id: str) -> list[Message]:
        """The aggregate's messages, converted."""
        agg = self._get(session_id)
        if agg is None:
            return []
        return msgspec.convert(agg.transcript, list[Message])

    def append_transcript_messages(self, session_id: str, messages: list[Message]) -> None:
        """One `MessagesAppended` event for the whole list."""
        agg = self._agg(session_id)
        agg.append_messages(_b(list(messages)))
        self.app.save(agg)
