"""A few end-to-end runs of the real `eventstore` process: the installed console script,
`python -m eventstore`, signals stopping `follow`, and a reader that goes away (EPIPE).
Everything else is tested in-process (tests/test_cli.py, test_cli_refusals.py)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import make_entry

from eventstore import SessionStore

ENV = {**os.environ, "COLUMNS": "200", "PYTHONUNBUFFERED": "1"}
SCRIPT = Path(sys.executable).with_name("eventstore")


def run(*args: object, cwd: Path, ok: int = 0) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "eventstore", *map(str, args)],
        capture_output=True, text=True, env=ENV, cwd=cwd, timeout=120,
    )  # fmt: skip
    assert proc.returncode == ok, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cwd = tmp_path_factory.mktemp("smoke")
    out = run("demo", cwd=cwd).stdout
    assert "wrote a new demo session 'demo' in .eventstore (21 events)" in out
    return cwd / ".eventstore"


@pytest.mark.skipif(not SCRIPT.exists(), reason="no console script beside this interpreter")
def test_the_console_script(demo: Path) -> None:
    proc = subprocess.run(
        [str(SCRIPT), "verify", str(demo), "demo", "--json"],
        capture_output=True, text=True, env=ENV, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["ok"] is True
    version = subprocess.run([str(SCRIPT), "--version"], capture_output=True, text=True)
    assert version.stdout.startswith("eventstore ") and version.returncode == 0


def test_errors_are_one_line_without_a_traceback(tmp_path: Path) -> None:
    proc = run("state", tmp_path / "nope", "demo", cwd=tmp_path, ok=2)
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("eventstore: error: no store")


def test_follow_stops_on_sigint_and_sigterm(demo: Path, tmp_path: Path) -> None:
    root = tmp_path / "store"
    shutil.copytree(demo, root)
    procs = {
        sig: subprocess.Popen(
            [sys.executable, "-m", "eventstore", "follow", str(root), "demo", *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=ENV,
        )  # fmt: skip
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
        rest, err = p.communicate(timeout=20)
        assert p.returncode == 0, (sig, err)
        assert "Traceback" not in err and rest == ""
    events = [json.loads(line) for line in outs[signal.SIGINT]]
    assert [e["seq"] for e in events] == list(range(12, 23))
    assert events[-1]["entry"]["run_id"] == "run-follow"
    plain = outs[signal.SIGTERM]
    assert plain[0].split()[0] == "12" and "[run-follow] step 1" in plain[-1]


def test_a_reader_that_goes_away_is_not_an_error(tmp_path: Path) -> None:
    root = tmp_path / "store"
    with SessionStore(root) as store:
        for i in range(3000):  # far more output than a pipe buffers
            store.append_progress_entry("s", make_entry(i))
    p = subprocess.Popen(
        [sys.executable, "-m", "eventstore", "log", str(root), "s"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV,
    )  # fmt: skip
    assert p.stdout is not None and p.stderr is not None
    assert p.stdout.readline().split() == [b"SEQ", b"TIME", b"TYPE", b"SUMMARY"]
    p.stdout.close()  # like `| head -1`
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 0, err
    assert "Traceback" not in err and "Broken pipe" not in err
