"""The benchmark's check mode on a tiny workload: every backend gives the same answers.

Backends whose optional package (the `eventsourcing` library) is missing are skipped.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

# `bench/` lives at the repository root and is not an installed package
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


from bench.backends import BACKENDS, available  # noqa: E402
from bench.check import run_check  # noqa: E402


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_backend_agrees_with_eventstore(name: str) -> None:
    if not available(name):
        pytest.skip(f"{name} needs {BACKENDS[name].needs}, which is not installed")
    ok, problems, skipped = run_check(turns=25, backends=[name])
    assert problems == []
    assert name in ok
    assert skipped == []


def test_check_reports_a_mismatch(monkeypatch: pytest.MonkeyPatch) -> None:
    from bench.baselines import rewrite_json

    real = rewrite_json.RewriteJsonStore.load_transcript_messages

    def dropping(self: rewrite_json.RewriteJsonStore, sid: str) -> list:  # type: ignore[type-arg]
        return real(self, sid)[1:]

    monkeypatch.setattr(rewrite_json.RewriteJsonStore, "load_transcript_messages", dropping)
    ok, problems, _ = run_check(turns=5, backends=["rewrite-json"])
    assert "rewrite-json" not in ok
    assert any("transcript" in p for p in problems)


def test_missing_eventsourcing_is_reported_not_fatal(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "eventsourcing" else real(name, *a),
    )
    ok, problems, skipped = run_check(turns=3, backends=["eventsourcing-normal"])
    assert skipped == ["eventsourcing-normal"]
    assert problems == []


@pytest.mark.parametrize("paired", [False, True], ids=["rows-interleaved", "ops-interleaved"])
def test_fsync_floor_prints_every_row_against_the_floor_and_its_flush_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], paired: bool
) -> None:
    from bench import fsync_floor

    args = ["--n", "3", "--repeat", "2", "--dir", str(tmp_path)] + ["--paired"] * paired
    assert fsync_floor.main(args) == 0
    out = capsys.readouterr().out
    rows = {
        line.split(" | ")[0][2:]: line.split(" | ") for line in out.splitlines() if line[:2] == "| "
    }
    for row in fsync_floor.ROWS:
        assert row in rows
    assert rows["overwrite"][5] == "1.00×"  # every row against the floor of its own run
    assert rows["grow"][-1] == "1.00× |"
    # where the time goes: inside the flush calls and the rest, for the rows that flush
    # through `os` (SQLite flushes from C: not seen)
    assert rows["eventstore flush"][3] == "0" and rows["sqlite FULL"][3] == "-"
    assert float(rows["eventstore"][3].replace(",", "")) > 0


def test_ab_cold_prints_a_row_per_size_with_the_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    from pathlib import Path

    from bench import ab_cold

    repo = Path(ab_cold.__file__).resolve().parents[1]
    assert ab_cold.main([str(repo), "--turns", "10,20", "--runs", "1"]) == 0
    rows = [r for r in capsys.readouterr().out.splitlines() if r[:3] in ("| 1", "| 2")]
    assert [r.split("|")[1].strip() for r in rows] == ["10", "20"]
    assert all(r.rstrip().endswith("× |") for r in rows)


def test_ab_cold_times_appends_per_op(capsys: pytest.CaptureFixture[str]) -> None:
    from pathlib import Path

    from bench import ab_cold

    repo = Path(ab_cold.__file__).resolve().parents[1]
    assert ab_cold.main([str(repo), "--turns", "10", "--runs", "1", "--load", "appends"]) == 0
    out = capsys.readouterr().out
    assert "us per op" in out
    row = next(r for r in out.splitlines() if r.startswith("| 10 |"))
    old, new = (float(c.split()[0]) for c in row.split("|")[2:4])
    assert old > 0 and new > 0 and row.rstrip().endswith("× |")


def test_instructions_counts_one_append_of_each_checkout(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The A/B's arithmetic and parsing, with a stand-in for valgrind that reports 1,000
    instructions of start-up and 10 an append (the real count takes minutes under
    callgrind: `python -m bench.instructions` is a benchmark, not a test)."""
    from bench import instructions

    fake = tmp_path / "valgrind"
    fake.write_text(
        "#!" + sys.executable + "\n"
        "import re, sys\n"
        "n = int(re.search(r'range\\((\\d+)\\)', sys.argv[-1]).group(1))\n"
        "print(f'==1== Collected : {1000 + 10 * n}', file=sys.stderr)\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    repo = Path(instructions.__file__).resolve().parents[1]
    assert instructions.main([str(repo), "--appends", "100"]) == 0
    row = capsys.readouterr().out.strip().splitlines()[-1]
    assert row == "| 10 | 10 | 1.00× |"


def test_loop_lag_prints_its_figures(capsys: pytest.CaptureFixture[str]) -> None:
    """`python -m bench.loop_lag` (the event loop's lag while the async store appends)
    runs and prints a row a run; the figures are for reading, never a bound."""
    from bench import loop_lag

    assert loop_lag.main(["--appends", "50", "--sessions", "2", "--repeat", "1"]) == 0
    rows = [r for r in capsys.readouterr().out.splitlines() if r.startswith("| 1 |")]
    assert len(rows) == 1 and rows[0].count("|") == 7
