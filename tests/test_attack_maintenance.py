"""An outside attack on the maintenance and audit paths: importing the older design's
files (`eventstore.legacy`), export (`eventstore.export`), expiry and pruning
(`eventstore.lifecycle`), `verify`, `repair`, `migrate` and the memory engine.

Each finding test states the promise it holds and how the code before its fix broke
it; the tests marked "held" are coverage of attacks that did not break anything.
Findings whose fix belongs in a file this attack could not change are strict xfails
naming the fix.
"""

from __future__ import annotations

import json
from pathlib import Path

from conftest import log_path, make_entry

from eventstore import SessionStore
from eventstore.legacy import import_legacy, legacy_file_name


def _legacy_dir(tmp_path: Path, files: dict[str, object]) -> Path:
    """A legacy directory holding one `sessions/<hex id>.json` per (id, document)."""
    base = tmp_path / "legacy"
    (base / "sessions").mkdir(parents=True)
    for sid, doc in files.items():
        (base / "sessions" / legacy_file_name(sid)).write_text(json.dumps(doc))
    return base


_GOOD = {"recent_progress": [{"run_id": "r", "summary": "kept", "created_at_secs": 1}]}


def test_a_legacy_time_past_the_calendar_fails_its_file_alone(tmp_path: Path) -> None:
    """Promise (legacy module docstring): a file that cannot be decoded is reported as
    failed, and the others are still imported. Broken: a `created_at_secs` past year
    9999 made `timedelta` raise OverflowError, which is no ValueError: it escaped
    `import_legacy` untyped and no later file was imported."""
    legacy = _legacy_dir(
        tmp_path,
        {
            "a-hostile": {
                "recent_progress": [{"run_id": "r", "summary": "x", "created_at_secs": 10**15}]
            },
            "b-good": _GOOD,
        },
    )
    with SessionStore(tmp_path / "store") as store:
        report = import_legacy(store, legacy)
        assert [(i.session_id, i.result) for i in report.items] == [
            ("a-hostile", "failed"),
            ("b-good", "imported"),
        ]
        assert "created_at" in report.items[0].detail
        assert store.list_sessions() == ["b-good"]


def test_an_unreadable_session_fails_its_legacy_file_alone(tmp_path: Path) -> None:
    """Promise (legacy module docstring): one bad file never stops the others. Broken:
    the already-imported check loaded the target session's idempotency keys outside
    the file's error handling, so a session whose log has a damaged line (or a planted
    symlink) raised CorruptLogError out of `import_legacy`: no later file was
    imported."""
    root = tmp_path / "store"
    with SessionStore(root) as store:
        store.append_progress_entry("a-damaged", make_entry(1))
        store.append_progress_entry("a-damaged", make_entry(2))
    log = log_path(root, "a-damaged")
    log.write_bytes(log.read_bytes().replace(b"summary", b"Summary", 1))
    legacy = _legacy_dir(tmp_path, {"a-damaged": _GOOD, "b-good": _GOOD})
    with SessionStore(root) as store:
        report = import_legacy(store, legacy)
        assert [(i.session_id, i.result) for i in report.items] == [
            ("a-damaged", "failed"),
            ("b-good", "imported"),
        ]
        assert "byte 0" in report.items[0].detail  # where the damage is
        assert (report.imported, report.failed) == (1, 1)
