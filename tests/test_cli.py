"""The `eventstore` command, run as a real subprocess against fixture stores."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import FIXTURES, LOGS, make_entry

from eventstore import SessionStore
from eventstore.layout import SessionPaths

REPO = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "COLUMNS": "200", "PYTHONUNBUFFERED": "1"}


def run(*args: object, ok: int | None = 0) -> subprocess.CompletedProcess[str]:
    """`python -m eventstore ARGS`; checks the exit code when `ok` is not None."""
    proc = subprocess.run(
        [sys.executable, "-m", "eventstore", *map(str, args)],
        capture_output=True,
        text=True,
        env=ENV,
        cwd=REPO,
        timeout=60,
    )
    if ok is not None:
        assert proc.returncode == ok, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def jsonl(text: str) -> list[Any]:
    return [json.loads(line) for line in text.splitlines()]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """A store with the demo session run twice (initialized, then continued)."""
    root = tmp_path_factory.mktemp("cli") / "store"
    first = run("demo", "--root", root).stdout
    second = run("demo", "--root", root).stdout
    return root, first, second


def _install(root: Path, name: str, sid: str = "golden") -> Path:
    paths = SessionPaths(root, sid)
    root.mkdir(mode=0o700, exist_ok=True)
    paths.create()
    paths.log.write_bytes((LOGS / name).read_bytes())
    return paths.log


def test_demo_writes_then_continues(demo: tuple[Path, str, str]) -> None:
    root, first, second = demo
    assert "wrote a new demo session 'demo'" in first
    assert "features: 4/20 passing" in first and "1. command  npm ci" in first
    assert "2. bash" in first and "checkpoints: 2" in first
    assert "continued the demo session 'demo'" in second and "features: 8/20 passing" in second
    doc = json.loads(run("demo", "--root", root.parent / "other", "--json").stdout)
    assert doc["created"] is True and len(doc["state"]["feature_list"]) == 20


def test_sessions(demo: tuple[Path, str, str]) -> None:
    root = demo[0]
    out = run("sessions", root).stdout
    assert out.splitlines()[0].split() == ["SESSION", "LAST", "SEQ", "LOG", "ARCHIVED", "UPDATED"]
    assert out.splitlines()[1].split()[:2] == ["demo", "40"]
    assert json.loads(run("sessions", root, "--json").stdout)[0]["last_seq"] == 40


def test_log_and_its_filters(demo: tuple[Path, str, str]) -> None:
    root = demo[0]
    lines = run("log", root, "demo").stdout.splitlines()
    assert lines[0].split() == ["SEQ", "TIME", "TYPE", "SUMMARY"] and len(lines) == 41
    assert lines[7].split()[3:6] == ["feature_pass_updated", "auth-001", "->"]
    flips = jsonl(run("log", root, "demo", "--type", "feature_pass_updated", "--json").stdout)
    assert len(flips) == 8 and {e["type"] for e in flips} == {"feature_pass_updated"}
    rng = run("log", root, "demo", "--from-seq", "3", "--to-seq", "5").stdout.splitlines()
    assert [r.split()[0] for r in rng[1:]] == ["3", "4", "5"]
    assert "no events match" in run("log", root, "demo", "--since", "2999-01-01").stdout
    until = run("log", root, "demo", "--until", "2000-01-01T00:00Z", "--json").stdout
    assert until == ""
    full = run("log", root, "demo", "--to-seq", "1", "--full").stdout
    assert "every feature in the list passes end to end" in full


def test_state_now_and_as_of(demo: tuple[Path, str, str]) -> None:
    root = demo[0]
    assert "features: 8/20 passing" in run("state", root, "demo").stdout
    old = run("state", root, "demo", "--at-seq", "2").stdout
    assert "features: 0/20 passing" in old and "as of seq 2" in old
    doc = json.loads(run("state", root, "demo", "--at-seq", "21", "--json").stdout)
    assert sum(f["passes"] for f in doc["feature_list"]) == 4
    at = json.loads(run("state", root, "demo", "--at-time", "2000-01-01", "--json").stdout)
    assert at["manifest"] is None
    run("state", root, "demo", "--at-seq", "2", "--at-time", "2000-01-01", ok=2)


def test_transcript(demo: tuple[Path, str, str]) -> None:
    root = demo[0]
    lines = run("transcript", root, "demo", "--last", "2").stdout.splitlines()
    assert len(lines) == 3 and lines[2].split()[1:3] == ["assistant", "Done"]
    msgs = json.loads(run("transcript", root, "demo", "--json").stdout)
    assert len(msgs) == 22 and msgs[0]["role"] == "system"


def test_verify_ok_and_tampered() -> None:
    root = FIXTURES / "tamper"
    out = run("verify", root / "edited", "golden", ok=1).stdout
    assert out.startswith("FAILED  golden")
    assert "hash_mismatch" in out and " 2516 " in out  # the byte offset of line 5
    rep = json.loads(run("verify", root / "snapshot_rehashed", "--all", "--json", ok=1).stdout)
    assert rep["ok"] is False
    assert rep["sessions"][0]["problems"][0]["kind"] == "snapshot_state"


def test_verify_demo_all_ok(demo: tuple[Path, str, str]) -> None:
    out = run("verify", demo[0], "--all").stdout
    assert out.startswith("ok      demo  events=40")
    assert json.loads(run("verify", demo[0], "demo", "--json").stdout)["ok"] is True
    run("verify", demo[0], ok=2)  # neither a session nor --all


def test_follow_prints_appends_and_stops_on_signals(
    demo: tuple[Path, str, str], tmp_path: Path
) -> None:
    root = tmp_path / "store"
    shutil.copytree(demo[0], root)
    procs = {
        sig: subprocess.Popen(
            [sys.executable, "-m", "eventstore", "follow", str(root), "demo", *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=ENV,
            cwd=REPO,
        )
        for sig, extra in (
            (signal.SIGINT, ["--json", "--interval", "0.05"]),
            (signal.SIGTERM, ["--interval", "0.05"]),
        )
    }
    outs: dict[signal.Signals, list[str]] = {sig: [] for sig in procs}
    for sig, p in procs.items():  # like tail -f, each first prints the last 10 events
        assert p.stdout is not None
        outs[sig] += [p.stdout.readline() for _ in range(10)]
    with SessionStore(root) as store:
        store.append_progress_entry("demo", make_entry(1, run_id="run-follow"))
    for sig, p in procs.items():
        assert p.stdout is not None
        outs[sig].append(p.stdout.readline())  # the new event, as it is appended
        p.send_signal(sig)
        rest, err = p.communicate(timeout=10)
        assert p.returncode == 0, (sig, err)
        assert "Traceback" not in err and rest == ""
    events = [json.loads(line) for line in outs[signal.SIGINT]]
    assert [e["seq"] for e in events] == list(range(31, 42))
    assert events[-1]["entry"]["run_id"] == "run-follow"
    plain = outs[signal.SIGTERM]
    assert plain[0].split()[0] == "31" and "[run-follow] step 1" in plain[-1]


def test_stats(demo: tuple[Path, str, str]) -> None:
    out = run("stats", demo[0], "demo").stdout
    assert "events   40 (seq 1..40)" in out and "feature_pass_updated" in out
    doc = json.loads(run("stats", demo[0], "demo", "--json").stdout)
    assert doc["by_type"]["feature_pass_updated"] == 8 and doc["archive_files"] == 0


def test_export(demo: tuple[Path, str, str]) -> None:
    root = demo[0]
    doc = json.loads(run("export", root, "demo").stdout)
    assert doc["last_seq"] == 40 and len(doc["transcript"]) == 22
    raw = run("export", root, "demo", "--format", "jsonl").stdout
    assert raw == SessionPaths(root, "demo").log.read_text(encoding="utf-8")


def test_import_legacy(tmp_path: Path) -> None:
    root = tmp_path / "store"
    out = run("import-legacy", root, FIXTURES / "legacy").stdout
    assert "3 imported, 0 skipped, 0 failed" in out and "sesión-ünïcode ✓/日本" in out
    again = json.loads(run("import-legacy", root, FIXTURES / "legacy", "--json").stdout)
    assert (again["imported"], again["skipped"]) == (0, 3)
    run("import-legacy", root, tmp_path / "nowhere", ok=2)


def test_repair(tmp_path: Path) -> None:
    root = tmp_path / "store"
    _install(root, "torn_line.jsonl")
    out = run("repair", root, "golden").stdout
    assert "action          truncated" in out
    _install(root, "corrupt_middle.jsonl")
    rep = json.loads(run("repair", root, "golden", "--json").stdout)
    assert rep["action"] == "moved_aside" and Path(rep["moved_to"]).exists()
    assert rep["kept_events"] == 9
    run("verify", root, "golden")


def test_compact_many_with_a_corrupt_one(tmp_path: Path) -> None:
    """A store of 200 sessions, one corrupt and one too small: the others are compacted,
    the corrupt one is reported with where it broke, and the exit code says so."""
    root = tmp_path / "store"
    for i in range(198):
        _install(root, "complete.jsonl", f"s{i}")
    with SessionStore(root) as store:
        store.append_progress_entry("tiny", make_entry(0))  # below --min-bytes
    _install(root, "corrupt_middle.jsonl", "broken")
    dry = run("compact", root, "--all", "--dry-run", "--min-bytes", "1000").stdout
    assert "199 would compact, 1 skipped, 0 failed" in dry  # a dry run reads no log
    out = run("compact", root, "--all", "--min-bytes", "1000", ok=1).stdout
    assert "198 compacted, 1 skipped, 1 failed" in out
    assert "failed         broken:" in out and "byte" in out
    doc = json.loads(run("compact", root, "s0", "s1", "--json").stdout)
    assert [s["result"] for s in doc["sessions"]] == ["skipped", "skipped"]  # already compact
    assert run("verify", root, "s3").returncode == 0
    assert len(list((SessionPaths(root, "s3").archive).iterdir())) == 1
    run("compact", root, ok=2)


def test_errors_are_one_line_with_exit_2(tmp_path: Path) -> None:
    missing = run("state", tmp_path / "nope", "demo", ok=2)
    assert missing.stderr.count("\n") == 1 and "no store at" in missing.stderr
    assert not (tmp_path / "nope").exists()  # a read never creates a store
    root = tmp_path / "store"
    _install(root, "corrupt_middle.jsonl")
    unknown = run("log", root, "nobody", ok=2)
    assert "unknown session 'nobody'" in unknown.stderr
    corrupt = run("state", root, "golden", ok=2)
    assert corrupt.stderr.count("\n") == 1 and "byte" in corrupt.stderr
    assert "seq 10" in corrupt.stderr
    assert "examples:" in run(ok=0).stdout  # no arguments: the help


def test_help_has_examples_and_exit_codes() -> None:
    out = run("--help").stdout
    assert "examples:" in out and "exit codes:" in out
    for cmd in ("demo", "sessions", "log", "state", "transcript", "verify", "follow", "stats",
                "export", "import-legacy", "repair", "compact"):  # fmt: skip
        assert cmd in out
    assert "eventstore log .eventstore demo --type" in run("log", "--help").stdout
    try:
        import eventstore.cli_contexts  # noqa: F401
    except ImportError:
        assert "contexts" not in out
    else:
        assert "contexts" in out
