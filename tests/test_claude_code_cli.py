"""`eventstore import-claude-code` and `eventstore export --format claude-code`, run
in-process through `eventstore.cli.main` (and once as a process, to stop it by signal)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from eventstore.cli.app import main
from eventstore.integrations.claude_code import (
    export_transcript,
    open_store,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "claude_code"
PROJECT = FIXTURES / "projects" / "-home-dev-kvcache"
S1 = "0b7e4f5c-2d1a-4c3b-9e8f-7a6b5c4d3e2f"
S2 = "5f3c9a10-8b2e-4d7f-a1c6-e9d8b7a6f504"
FILE1 = PROJECT / f"{S1}.jsonl"


def test_import_a_directory_then_export_byte_for_byte(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    root = tmp_path / "store"
    assert main(["import-claude-code", str(root), str(FIXTURES / "projects")]) == 0
    out = capsysbinary.readouterr().out.decode()
    assert "imported" in out and S1 in out and S2 in out
    assert "2 files: 23 new lines, 0 skipped lines, 0 failed" in out
    assert main(["export", str(root), S1, "--format", "claude-code"]) == 0
    assert capsysbinary.readouterr().out == FILE1.read_bytes()


def test_import_again_reports_unchanged_and_appends_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "store"
    main(["import-claude-code", str(root), str(FILE1)])
    capsys.readouterr()
    assert main(["import-claude-code", str(root), str(FILE1)]) == 0
    out = capsys.readouterr().out
    assert "unchanged" in out and "0 new lines" in out


def test_malformed_lines_go_to_stderr_with_file_and_line_and_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "store"
    assert main(["import-claude-code", str(root), str(FIXTURES / "odd.jsonl"), str(FILE1)]) == 1
    captured = capsys.readouterr()
    skipped = [ln for ln in captured.err.splitlines() if "skipped" in ln]
    assert [ln.split("odd.jsonl:")[1].split(":")[0] for ln in skipped] == list("234578")
    assert "6 skipped lines" in captured.out
    with open_store(root) as s:  # the other file and the good lines were imported
        assert len(s.load_transcript_messages(S1)) > 3


def test_each_skipped_line_is_printed_once_and_one_file_is_one_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """0.1.0 printed each skipped line twice (its own line and a logging warning) and
    said "1 files"."""
    f = tmp_path / "s.jsonl"
    f.write_bytes(
        b'{"type":"user","sessionId":"s","message":{"role":"user","content":"a"}}\n'
        b"not json\n"
        b'{"x":' + b"[" * 1000 + b"]" * 1000 + b"}\n"
    )
    assert main(["import-claude-code", str(tmp_path / "store"), str(f)]) == 1
    captured = capsys.readouterr()
    assert [ln.split("s.jsonl:")[1][:1] for ln in captured.err.splitlines()] == ["2", "3"]
    assert "1 file: 1 new line, 2 skipped lines, 0 failed" in captured.out


def test_a_missing_file_fails_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "store"
    assert main(["import-claude-code", str(root), str(tmp_path / "nope.jsonl"), str(FILE1)]) == 1
    captured = capsys.readouterr()
    assert "nope.jsonl" in captured.err and "failed" in captured.out
    with open_store(root) as s:
        assert s.list_sessions() == [S1]


def test_json_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "store"
    assert main(["import-claude-code", str(root), str(FIXTURES / "odd.jsonl"), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc[0]["appended"] == {S1: 3, "odd": 1}
    assert [s["line"] for s in doc[0]["skipped"]] == [2, 3, 4, 5, 7, 8]


def test_export_of_an_unknown_session_or_store_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["export", str(tmp_path / "none"), "x", "--format", "claude-code"]) == 2
    assert not (tmp_path / "none").exists()
    main(["import-claude-code", str(tmp_path / "s"), str(FILE1)])
    assert main(["export", str(tmp_path / "s"), "nope", "--format", "claude-code"]) == 2
    assert "unknown session 'nope'" in capsys.readouterr().err


def test_follow_imports_lines_as_they_are_written_and_exits_when_idle(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "store"
    f = tmp_path / FILE1.name
    lines = FILE1.read_bytes().splitlines(keepends=True)
    f.write_bytes(lines[0] + lines[1][:40])  # a partially written line

    def writer() -> None:
        time.sleep(0.2)
        with f.open("ab") as out:
            out.write(lines[1][40:])
            for ln in lines[2:]:
                out.write(ln)
                out.flush()
                time.sleep(0.01)

    t = threading.Thread(target=writer)
    t.start()
    code = main(
        [
            "import-claude-code",
            str(root),
            str(f),
            "--follow",
            "--interval",
            "0.02",
            "--idle-exit",
            "1",
        ]
    )
    t.join()
    assert code == 0
    out = capsys.readouterr().out
    assert f"{f}: +1 lines, 1 new" in out  # the first poll: the complete line only
    with open_store(root) as s:
        assert b"".join(export_transcript(s, S1)) == FILE1.read_bytes()


def test_follow_stops_on_sigterm(tmp_path: Path) -> None:
    root = tmp_path / "store"
    f = tmp_path / FILE1.name
    lines = FILE1.read_bytes().splitlines(keepends=True)
    f.write_bytes(b"".join(lines[:3]))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "eventstore",
            "import-claude-code",
            str(root),
            str(f),
            "--follow",
            "--interval",
            "0.05",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
    )
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with open_store(root) as s:
                if s.list_sessions() and s.last_seq(S1) >= 1:
                    break
            time.sleep(0.05)
        with f.open("ab") as sink:
            sink.write(b"".join(lines[3:]))
        while time.monotonic() < deadline:
            with open_store(root) as s:
                if b"".join(export_transcript(s, S1)) == FILE1.read_bytes():
                    break
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert b"1 file: 19 new lines, 0 skipped lines, 0 failed" in out
