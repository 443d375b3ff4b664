"""The rewrite design eventstore replaces: one pretty-printed JSON file per session.

Every operation reads and parses the session's whole file, changes it, writes it
pretty-printed to `<file>.tmp`, removes the old file and renames the temporary one over
it (no fsync, no lock): quadratic cost over a session's life, and a window with no file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

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

__all__ = ["RewriteJsonStore"]


def _builtins(value: Any) -> Any:
    return msgspec.to_builtins(value)


class RewriteJsonStore:
    """`sessions/<hex of the UTF-8 id>.json` under `root`; see the module docstring."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.dir = self.root / "sessions"
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)

    def close(self) -> None:
        """Nothing to release: every operation opens and closes the file."""

    def _path(self, session_id: str) -> Path:
        return self.dir / (session_id.encode("utf-8").hex() + ".json")

    def _read(self, session_id: str) -> dict[str, Any] | None:
        try:
            with open(self._path(session_id), encoding="utf-8") as fh:
                data: dict[str, Any] = json.load(fh)
        except FileNotFoundError:
            return None
        return data

    def _write(self, session_id: str, data: dict[str, Any]) -> None:
        path = self._path(session_id)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=2, ensure_ascii=False)
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
        os.rename(tmp, path)

    def _change(self, session_id: str) -> dict[str, Any]:
        data = self._read(session_id)
        if data is None:
            data = {
                "manifest": None,
                "feature_list": [],
                "recent_progress": [],
                "checkpoints": [],
                "transcript": [],
            }
        return data

    # -- the session API --------------------------------------------------------------

    def is_initialized(self, session_id: str) -> bool:
        """True once the session has a manifest."""
        data = self._read(session_id)
        return data is not None and data.get("manifest") is not None

    def initialize_session_if_missing(
        self,
        session_id: str,
        manifest: SessionManifest,
        feature_list: list[FeatureRecord],
        initial_progress_entry: ProgressEntry | None = None,
        initial_checkpoint: RunCheckpoint | None = None,
    ) -> bool:
        """Write manifest, features and the optional first entries unless a manifest exists."""
        data = self._change(session_id)
        if data["manifest"] is not None:
            return False
        data["manifest"] = _builtins(manifest)
        data["feature_list"] = _builtins(list(feature_list))
        if initial_progress_entry is not None:
            data["recent_progress"].append(_builtins(initial_progress_entry))
        if initial_checkpoint is not None:
            data["checkpoints"].append(_builtins(initial_checkpoint))
        self._write(session_id, data)
        return True

    def load_bootstrap_state(self, session_id: str) -> BootstrapState:
        """Parse the whole file (transcript included) and build the bootstrap state."""
        data = self._read(session_id)
        if data is None:
            return BootstrapState()
        data.pop("transcript", None)
        return msgspec.convert(data, BootstrapState)

    def save_manifest(self, session_id: str, manifest: SessionManifest) -> None:
        """Replace the manifest."""
        data = self._change(session_id)
        data["manifest"] = _builtins(manifest)
        self._write(session_id, data)

    def append_progress_entry(self, session_id: str, entry: ProgressEntry) -> None:
        """Append a progress note."""
        data = self._change(session_id)
        data["recent_progress"].append(_builtins(entry))
        self._write(session_id, data)

    def replace_feature_list(self, session_id: str, features: list[FeatureRecord]) -> None:
        """Replace the feature list, order kept."""
        data = self._change(session_id)
        data["feature_list"] = _builtins(list(features))
        self._write(session_id, data)

    def update_feature_pass(self, session_id: str, feature_id: str, passes: bool) -> None:
        """Set `passes` of every feature with this id; FeatureNotFoundError if none."""
        data = self._change(session_id)
        found = False
        for f in data["feature_list"]:
            if f["id"] == feature_id:
                f["passes"] = passes
                found = True
        if not found:
            raise FeatureNotFoundError(session_id, feature_id)
        self._write(session_id, data)

    def record_run_checkpoint(self, session_id: str, checkpoint: RunCheckpoint) -> None:
        """Append a run checkpoint."""
        data = self._change(session_id)
        data["checkpoints"].append(_builtins(checkpoint))
        self._write(session_id, data)

    def load_transcript_messages(self, session_id: str) -> list[Message]:
        """Every message in append order."""
        data = self._read(session_id)
        if data is None:
            return []
        return msgspec.convert(data.get("transcript", []), list[Message])

    def append_transcript_messages(self, session_id: str, messages: list[Message]) -> None:
        """Append the messages in one rewrite."""
        data = self._change(session_id)
        data["transcript"].extend(_builtins(list(messages)))
        self._write(session_id, data)
