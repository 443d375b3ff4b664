"""The row design: stdlib `sqlite3`, WAL journal, one table per record kind.

Tables: manifests, metadata, init-plan steps, features (with a position column),
progress, checkpoints and transcript. Every operation is one transaction
(`BEGIN IMMEDIATE` ... `COMMIT`); loading runs one ordered SELECT per table.
`synchronous="NORMAL"` survives a killed process (like eventstore's "flush");
`synchronous="FULL"` fsyncs every commit (like eventstore's "fsync").
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

from eventstore.errors import FeatureNotFoundError
from eventstore.records import (
    BootstrapState,
    FeatureRecord,
    InitCommand,
    InitPlan,
    InitShell,
    InitShellScript,
    Message,
    ProgressEntry,
    Role,
    RunCheckpoint,
    RunStatus,
    SessionManifest,
)

__all__ = ["SqliteRowsStore"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS manifests (
    session_id TEXT PRIMARY KEY,
    active_branch TEXT NOT NULL,
    current_objective TEXT NOT NULL,
    schema_version INTEGER NOT NULL,
    harness_version TEXT NOT NULL,
    last_known_good_commit TEXT,
    has_init_plan INTEGER NOT NULL,
    manifest_session_id TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS metadata (
    session_id TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL,
    PRIMARY KEY (session_id, key)
);
CREATE TABLE IF NOT EXISTS init_steps (
    session_id TEXT NOT NULL, position INTEGER NOT NULL, kind TEXT NOT NULL,
    program TEXT, args TEXT, shell TEXT, script TEXT,
    PRIMARY KEY (session_id, position)
);
CREATE TABLE IF NOT EXISTS features (
    session_id TEXT NOT NULL, position INTEGER NOT NULL, id TEXT NOT NULL,
    category TEXT NOT NULL, description TEXT NOT NULL, steps TEXT NOT NULL,
    passes INTEGER NOT NULL,
    PRIMARY KEY (session_id, position)
);
CREATE INDEX IF NOT EXISTS features_by_id ON features (session_id, id);
CREATE TABLE IF NOT EXISTS progress (
    n INTEGER PRIMARY KEY, session_id TEXT NOT NULL,
    run_id TEXT NOT NULL, summary TEXT NOT NULL, created_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS progress_by_session ON progress (session_id, n);
CREATE TABLE IF NOT EXISTS checkpoints (
    n INTEGER PRIMARY KEY, session_id TEXT NOT NULL, run_id TEXT NOT NULL,
    started_at TEXT NOT NULL, completed_at TEXT, status TEXT NOT NULL, note TEXT
);
CREATE INDEX IF NOT EXISTS checkpoints_by_session ON checkpoints (session_id, n);
CREATE TABLE IF NOT EXISTS transcript (
    n INTEGER PRIMARY KEY, session_id TEXT NOT NULL, role TEXT NOT NULL, content TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS transcript_by_session ON transcript (session_id, n);
"""


def _ts(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _dt(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


class SqliteRowsStore:
    """All sessions in `root/store.db`; see the module docstring."""

    def __init__(self, root: str | os.PathLike[str], synchronous: str = "NORMAL") -> None:
        if synchronous not in ("NORMAL", "FULL"):
            raise ValueError("synchronous must be NORMAL or FULL")
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.db = sqlite3.connect(self.root / "store.db", isolation_level=None, timeout=30.0)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(f"PRAGMA synchronous={synchronous}")
        self.db.executescript(_SCHEMA)

    def close(self) -> None:
        """Close the connection (checkpointing the WAL)."""
        self.db.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    # -- writing helpers --------------------------------------------------------------

    @staticmethod
    def _put_manifest(db: sqlite3.Connection, sid: str, m: SessionManifest) -> None:
        db.execute(
            "INSERT OR REPLACE INTO manifests VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                sid,
                m.active_branch,
                m.current_objective,
                m.schema_version,
                m.harness_version,
                m.last_known_good_commit,
                m.init_plan is not None,
                m.session_id,
            ),
        )
        db.execute("DELETE FROM metadata WHERE session_id = ?", (sid,))
        db.executemany(
            "INSERT INTO metadata VALUES (?, ?, ?)", [(sid, k, v) for k, v in m.metadata.items()]
        )
        db.execute("DELETE FROM init_steps WHERE session_id = ?", (sid,))
        rows = []
        for i, step in enumerate(m.init_plan.steps if m.init_plan else []):
            if isinstance(step, InitCommand):
                rows.append((sid, i, "command", step.program, json.dumps(step.args), None, None))
            else:
                rows.append((sid, i, "shell_script", None, None, step.shell.value, step.script))
        db.executemany("INSERT INTO init_steps VALUES (?, ?, ?, ?, ?, ?, ?)", rows)

    @staticmethod
    def _put_features(db: sqlite3.Connection, sid: str, features: list[FeatureRecord]) -> None:
        db.execute("DELETE FROM features WHERE session_id = ?", (sid,))
        db.executemany(
            "INSERT INTO features VALUES (?, ?, ?, ?, ?, ?, ?)",
            [
                (sid, i, f.id, f.category, f.description, json.dumps(f.steps), f.passes)
                for i, f in enumerate(features)
            ],
        )

    @staticmethod
    def _put_progress(db: sqlite3.Connection, sid: str, e: ProgressEntry) -> None:
        db.execute(
            "INSERT INTO progress (session_id, run_id, summary, created_at) VALUES (?, ?, ?, ?)",
            (sid, e.run_id, e.summary, _ts(e.created_at)),
        )

    @staticmethod
    def _put_checkpoint(db: sqlite3.Connection, sid: str, c: RunCheckpoint) -> None:
        db.execute(
            "INSERT INTO checkpoints (session_id, run_id, started_at, completed_at, status, note)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (sid, c.run_id, _ts(c.started_at), _ts(c.completed_at), c.status.value, c.note),
        )

    # -- the session API --------------------------------------------------------------

    def is_initialized(self, session_id: str) -> bool:
        """True once the session has a manifest."""
        row = self.db.execute(
            "SELECT 1 FROM manifests WHERE session_id = ?", (session_id,)
        ).fetchone()
        return row is not None

    def initialize_session_if_missing(
        self,
        session_id: str,
        manifest: SessionManifest,
        feature_list: list[FeatureRecord],
        initial_progress_entry: ProgressEntry | None = None,
        initial_checkpoint: RunCheckpoint | None = None,
    ) -> bool:
        """One transaction; False (nothing written) if a manifest exists."""
        with self._tx() as db:
            row = db.execute(
                "SELECT 1 FROM manifests WHERE session_id = ?", (session_id,)
            ).fetchone()
            if row is not None:
                return False
            self._put_manifest(db, session_id, manifest)
            self._put_features(db, session_id, list(feature_list))
            if initial_progress_entry is not None:
                self._put_progress(db, session_id, initial_progress_entry)
            if initial_checkpoint is not None:
                self._put_checkpoint(db, session_id, initial_checkpoint)
        return True

    def load_bootstrap_state(self, session_id: str) -> BootstrapState:
        """One ordered SELECT per table, then build the records."""
        db, sid = self.db, (session_id,)
        db.execute("BEGIN")
        try:
            m = db.execute("SELECT * FROM manifests WHERE session_id = ?", sid).fetchone()
            meta = db.execute(
                "SELECT key, value FROM metadata WHERE session_id = ? ORDER BY key", sid
            ).fetchall()
            steps = db.execute(
                "SELECT kind, program, args, shell, script FROM init_steps"
                " WHERE session_id = ? ORDER BY position",
                sid,
            ).fetchall()
            feats = db.execute(
                "SELECT id, category, description, steps, passes FROM features"
                " WHERE session_id = ? ORDER BY position",
                sid,
            ).fetchall()
            progress = db.execute(
                "SELECT run_id, summary, created_at FROM progress WHERE session_id = ? ORDER BY n",
                sid,
            ).fetchall()
            cps = db.execute(
                "SELECT run_id, started_at, completed_at, status, note FROM checkpoints"
                " WHERE session_id = ? ORDER BY n",
                sid,
            ).fetchall()
        finally:
            db.execute("COMMIT")
        manifest = None
        if m is not None:
            plan = None
            if m[6]:
                plan = InitPlan(
                    steps=[
                        InitCommand(program=s[1], args=json.loads(s[2]))
                        if s[0] == "command"
                        else InitShellScript(shell=InitShell(s[3]), script=s[4])
                        for s in steps
                    ]
                )
            manifest = SessionManifest(
                session_id=m[7],
                active_branch=m[1],
                current_objective=m[2],
                schema_version=m[3],
                harness_version=m[4],
                last_known_good_commit=m[5],
                init_plan=plan,
                metadata=dict(meta),
            )
        return BootstrapState(
            manifest=manifest,
            feature_list=[
                FeatureRecord(
                    id=f[0],
                    category=f[1],
                    description=f[2],
                    steps=json.loads(f[3]),
                    passes=bool(f[4]),
                )
                for f in feats
            ],
            recent_progress=[
                ProgressEntry(run_id=p[0], summary=p[1], created_at=datetime.fromisoformat(p[2]))
                for p in progress
            ],
            checkpoints=[
                RunCheckpoint(
                    run_id=c[0],
                    started_at=datetime.fromisoformat(c[1]),
                    completed_at=_dt(c[2]),
                    status=RunStatus(c[3]),
                    note=c[4],
                )
                for c in cps
            ],
        )

    def save_manifest(self, session_id: str, manifest: SessionManifest) -> None:
        """Replace the manifest (row, metadata and init steps) in one transaction."""
        with self._tx() as db:
            self._put_manifest(db, session_id, manifest)

    def append_progress_entry(self, session_id: str, entry: ProgressEntry) -> None:
        """Insert one progress row."""
        with self._tx() as db:
            self._put_progress(db, session_id, entry)

    def replace_feature_list(self, session_id: str, features: list[FeatureRecord]) -> None:
        """Delete and re-insert the session's features, positions in order."""
        with self._tx() as db:
            self._put_features(db, session_id, list(features))

    def update_feature_pass(self, session_id: str, feature_id: str, passes: bool) -> None:
        """Update matching rows; FeatureNotFoundError (rolled back) if none matched."""
        with self._tx() as db:
            cur = db.execute(
                "UPDATE features SET passes = ? WHERE session_id = ? AND id = ?",
                (passes, session_id, feature_id),
            )
            if cur.rowcount == 0:
                raise FeatureNotFoundError(session_id, feature_id)

    def record_run_checkpoint(self, session_id: str, checkpoint: RunCheckpoint) -> None:
        """Insert one checkpoint row."""
        with self._tx() as db:
            self._put_checkpoint(db, session_id, checkpoint)

    def load_transcript_messages(self, session_id: str) -> list[Message]:
        """One ordered SELECT."""
        rows = self.db.execute(
            "SELECT role, content FROM transcript WHERE session_id = ? ORDER BY n", (session_id,)
        ).fetchall()
        return [Message(role=Role(r), content=c) for r, c in rows]

    def append_transcript_messages(self, session_id: str, messages: list[Message]) -> None:
        """Insert every message in one transaction."""
        with self._tx() as db:
            db.executemany(
                "INSERT INTO transcript (session_id, role, content) VALUES (?, ?, ?)",
                [(session_id, m.role.value, m.content) for m in messages],
            )
