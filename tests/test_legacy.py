"""import-legacy: the older design's per-session JSON files become sessions with equal state."""

from __future__ import annotations

import json
import os
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import FIXTURES, log_path, make_entry

from eventstore import (
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
    SessionStore,
)
from eventstore.ops.legacy import (
    import_legacy,
    legacy_file_name,
)

LEGACY = FIXTURES / "legacy"


def _time(obj: dict[str, Any], prefix: str) -> datetime | None:
    secs = obj.get(f"{prefix}_secs")
    if secs is None:
        return None
    nanos = obj.get(f"{prefix}_nanos") or 0
    # written independently of eventstore.ops.legacy: through a float-free integer path
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(
        microseconds=secs * 1_000_000 + nanos // 1000
    )


def _expected(doc: dict[str, Any]) -> tuple[BootstrapState, list[Message]]:
    """The state a legacy file describes, built by hand from its JSON."""
    m = doc.get("manifest")
    manifest = None
    if m is not None:
        plan = None
        if m.get("init_plan") is not None:
            steps: list[InitCommand | InitShellScript] = []
            for s in m["init_plan"]["steps"]:
                if s["kind"] == "command":
                    steps.append(InitCommand(program=s["program"], args=s.get("args", [])))
                else:
                    steps.append(InitShellScript(shell=InitShell(s["shell"]), script=s["script"]))
            plan = InitPlan(steps=steps)
        manifest = SessionManifest(
            session_id=m["session_id"],
            active_branch=m["active_branch"],
            current_objective=m["current_objective"],
            schema_version=m.get("schema_version", 1),
            harness_version=m.get("harness_version", "v0"),
            last_known_good_commit=m.get("last_known_good_commit"),
            init_plan=plan,
            metadata=m.get("metadata", {}),
        )
    state = BootstrapState(
        manifest=manifest,
        feature_list=[FeatureRecord(**f) for f in doc.get("feature_list", [])],
        recent_progress=[
            ProgressEntry(
                run_id=p["run_id"],
                summary=p["summary"],
                created_at=_time(p, "created_at"),  # type: ignore[arg-type]
            )
            for p in doc.get("recent_progress", [])
        ],
        checkpoints=[
            RunCheckpoint(
                run_id=c["run_id"],
                started_at=_time(c, "started_at"),  # type: ignore[arg-type]
                completed_at=_time(c, "completed_at"),
                status=RunStatus(c.get("status", "in_progress")),
                note=c.get("note"),
            )
            for c in doc.get("checkpoints", [])
        ],
    )
    transcript = [
        Message(role=Role(t["role"]), content=t["content"]) for t in doc.get("transcript", [])
    ]
    return state, transcript


def _files() -> dict[str, dict[str, Any]]:
    return {
        bytes.fromhex(p.stem).decode(): json.loads(p.read_text(encoding="utf-8"))
        for p in sorted((LEGACY / "sessions").glob("*.json"))
    }


def test_fixtures_cover_what_the_issue_asks() -> None:
    files = _files()
    assert any(not sid.isascii() for sid in files)
    plans = [d["manifest"].get("init_plan") or {"steps": []} for d in files.values()]
    kinds = {s["kind"] for p in plans for s in p["steps"]}
    assert kinds == {"command", "shell_script"}
    cps = [c for d in files.values() for c in d.get("checkpoints", [])]
    assert any(c.get("completed_at_secs") is None for c in cps)
    assert any(c.get("completed_at_secs") is not None for c in cps)
    assert all(legacy_file_name(sid) in {p.name for p in (LEGACY / "sessions").iterdir()}
               for sid in files)  # fmt: skip


def test_import_state_equals_source_and_is_idempotent(root: Path) -> None:
    with SessionStore(root) as store:
        rep = import_legacy(store, LEGACY)
        assert (rep.imported, rep.skipped, rep.failed) == (3, 0, 0)
        for sid, doc in _files().items():
            state, transcript = _expected(doc)
            assert store.load_bootstrap_state(sid) == state, sid
            assert store.load_transcript_messages(sid) == transcript, sid
        seqs = {sid: store.last_seq(sid) for sid in store.list_sessions()}
        assert set(seqs) == set(_files())
        again = import_legacy(store, LEGACY)
        assert (again.imported, again.skipped, again.failed) == (0, 3, 0)
        assert {sid: store.last_seq(sid) for sid in store.list_sessions()} == seqs
    with SessionStore(root) as fresh:  # another process's view: same, and still idempotent
        assert import_legacy(fresh, LEGACY).imported == 0


def test_bad_files_fail_alone_and_occupied_sessions_are_skipped(root: Path, tmp_path: Path) -> None:
    legacy = tmp_path / "legacy"
    shutil.copytree(LEGACY, legacy)
    (legacy / "sessions" / "zz-not-hex.json").write_text("{}")
    (legacy / "sessions" / legacy_file_name("broken")).write_text('{"manifest": 3}')
    with SessionStore(root) as store:
        store.append_progress_entry("minimal", make_entry(1))  # the session already has history
        rep = import_legacy(store, legacy)
        by_result: dict[str, list[str | None]] = {}
        for item in rep.items:
            by_result.setdefault(item.result, []).append(item.session_id)
        assert sorted(by_result["failed"], key=str) == sorted([None, "broken"], key=str)
        assert by_result["skipped"] == ["minimal"]
        assert rep.imported == 2
        assert store.last_seq("minimal") == 1


@pytest.mark.parametrize("nanos", [0, 999, 1000, 999_999_999])
def test_nanoseconds_truncate_to_microseconds(root: Path, tmp_path: Path, nanos: int) -> None:
    legacy = tmp_path / "legacy"
    (legacy / "sessions").mkdir(parents=True)
    doc = {
        "manifest": {"session_id": "t", "active_branch": "b", "current_objective": "o"},
        "recent_progress": [
            {"run_id": "r", "summary": "s", "created_at_secs": -1, "created_at_nanos": nanos}
        ],
    }
    (legacy / "sessions" / legacy_file_name("t")).write_text(json.dumps(doc))
    with SessionStore(root) as store:
        assert import_legacy(store, legacy).imported == 1
        got = store.load_bootstrap_state("t").recent_progress[0].created_at
    assert got == datetime(1969, 12, 31, 23, 59, 59, nanos // 1000, tzinfo=UTC)


# -- attacks -------------------------------------------------------------------------------


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


@pytest.mark.timeout(10)
def test_a_fifo_in_the_legacy_directory_fails_alone_without_hanging(tmp_path: Path) -> None:
    """Promise (legacy module docstring): a file that cannot be read is reported as
    failed, and the others are still imported. Broken: a FIFO named like a session file
    (`sessions/<hex>.json`) made `import_legacy` block forever in its open (so did a
    link to /dev/zero, reading without end): no file after it was imported and the
    command never returned. Only a regular file is read now, opened without blocking."""
    legacy = _legacy_dir(tmp_path, {"b-good": _GOOD})
    os.mkfifo(legacy / "sessions" / legacy_file_name("a-fifo"))
    with SessionStore(tmp_path / "store") as store:
        report = import_legacy(store, legacy)
        assert [(i.session_id, i.result) for i in report.items] == [
            ("a-fifo", "failed"),
            ("b-good", "imported"),
        ]
        assert "not a regular file" in report.items[0].detail


def test_a_legacy_feature_list_with_an_id_twice_is_refused(tmp_path: Path) -> None:
    """Promise (README, Using it from Python): a feature id twice is refused with
    InvalidRecordError and nothing is written (`replace_feature_list`,
    `initialize_session_if_missing`); the legacy module docstring: a file that cannot be
    decoded fails alone. Broken: import wrote a legacy list holding feature "a" twice, a
    state no session call can make: `update_feature_pass` then flipped both, and
    writing the loaded list back was refused. The file now fails, naming the id."""
    feature = {"id": "a", "category": "c", "description": "d", "steps": [], "passes": False}
    legacy = _legacy_dir(tmp_path, {"a-dup": {"feature_list": [feature, feature]}, "b-good": _GOOD})
    with SessionStore(tmp_path / "store") as store:
        report = import_legacy(store, legacy)
        assert [(i.session_id, i.result) for i in report.items] == [
            ("a-dup", "failed"),
            ("b-good", "imported"),
        ]
        assert "'a' appears twice" in report.items[0].detail
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
