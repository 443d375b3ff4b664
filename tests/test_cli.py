"""The `eventstore` command, in-process through `eventstore.cli.main(argv)`: every
subcommand on the demo session and on fixture stores (corrupt, tampered, legacy)."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import FIXTURES, LOGS, make_entry, one_line_error

from eventstore import SessionStore
from eventstore.cli.app import main
from eventstore.engines.file.layout import SessionPaths


class Result:
    """What one `main(argv)` call printed and returned."""

    def __init__(self, code: int, out: str, err: str) -> None:
        self.code, self.out, self.err = code, out, err

    def json(self) -> Any:
        return json.loads(self.out)

    def jsonl(self) -> list[Any]:
        return [json.loads(line) for line in self.out.splitlines()]


def cli(*args: object, code: int | None = 0) -> Result:
    """Run `main(args)` with stdout/stderr captured; check the exit status unless None."""
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True)
    err = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in args])
    out.flush()
    res = Result(rc, out.buffer.getvalue().decode("utf-8"), err.getvalue())  # type: ignore[attr-defined]
    if code is not None:
        assert rc == code, (rc, res.out, res.err)
    assert "Traceback" not in res.err, res.err
    return res


@pytest.fixture(autouse=True)
def wide(monkeypatch: pytest.MonkeyPatch) -> None:
    """A wide terminal unless a test says otherwise (the width tests set their own)."""
    monkeypatch.setenv("COLUMNS", "200")


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """A store with the demo session run twice (initialized, then continued)."""
    root = tmp_path_factory.mktemp("cli") / "store"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COLUMNS", "200")
        first = cli("demo", "--root", root).out
        second = cli("demo", "--root", root).out
    return root, first, second


def install(root: Path, name: str, sid: str = "golden") -> Path:
    """Copy the fixture log `name` in as session `sid`'s live log."""
    paths = SessionPaths(root, sid)
    root.mkdir(mode=0o700, exist_ok=True)
    paths.create()
    paths.log.write_bytes((LOGS / name).read_bytes())
    return paths.log


def test_demo_writes_then_continues(demo: tuple[Path, str, str], tmp_path: Path) -> None:
    root, first, second = demo
    assert "wrote a new demo session 'demo'" in first
    assert "features: 4/20 passing" in first and "1. command  npm ci" in first
    assert "2. bash     npm run db:migrate" in first and "checkpoints: 2" in first
    assert "continued the demo session 'demo'" in second and "features: 8/20 passing" in second
    doc = cli("demo", "--root", tmp_path / "other", "--json").json()
    assert doc["created"] is True and len(doc["state"]["feature_list"]) == 20


def test_sessions(demo: tuple[Path, str, str]) -> None:
    root = demo[0]
    out = cli("sessions", root).out
    assert out.splitlines()[0].split() == ["SESSION", "LAST", "SEQ", "LOG", "IN", "LOG", "ARCHIVED"]
    row = out.splitlines()[1].split()
    assert row[:2] == ["demo", "40"] and row[4:] == ["40", "0"]
    doc = cli("sessions", root, "--json").json()[0]
    assert doc["last_seq"] == 40 and doc["log_events"] == 40
    assert doc["log_bytes"] == SessionPaths(root, "demo").log.stat().st_size


def test_sessions_of_an_empty_store(tmp_path: Path) -> None:
    assert cli("sessions", tmp_path).out == f"no sessions in {tmp_path}\n"


def test_log_and_its_filters(demo: tuple[Path, str, str]) -> None:
    root = demo[0]
    lines = cli("log", root, "demo").out.splitlines()
    assert lines[0].split() == ["SEQ", "TIME", "TYPE", "SUMMARY"] and len(lines) == 41
    assert lines[7].split()[3:6] == ["feature_pass_updated", "auth-001", "->"]
    flips = cli("log", root, "demo", "--type", "feature_pass_updated", "--json").jsonl()
    assert len(flips) == 8 and {e["type"] for e in flips} == {"feature_pass_updated"}
    rng = cli("log", root, "demo", "--from-seq", "3", "--to-seq", "5").out.splitlines()
    assert [r.split()[0] for r in rng[1:]] == ["3", "4", "5"]
    assert "no events match" in cli("log", root, "demo", "--since", "2999-01-01").out
    assert cli("log", root, "demo", "--until", "2000-01-01T00:00Z", "--json").out == ""
    full = cli("log", root, "demo", "--to-seq", "1", "--full").out
    assert "every feature in the list passes end to end" in full


def test_state_now_and_as_of(demo: tuple[Path, str, str]) -> None:
    root = demo[0]
    assert "features: 8/20 passing" in cli("state", root, "demo").out
    old = cli("state", root, "demo", "--at-seq", "2").out
    assert "features: 0/20 passing" in old and "as of seq 2" in old
    doc = cli("state", root, "demo", "--at-seq", "21", "--json").json()
    assert sum(f["passes"] for f in doc["feature_list"]) == 4
    at = cli("state", root, "demo", "--at-time", "2000-01-01", "--json").json()
    assert at["manifest"] is None
    both = cli("state", root, "demo", "--at-seq", "2", "--at-time", "2000-01-01", code=2)
    assert "not allowed with" in both.err


def test_transcript(demo: tuple[Path, str, str]) -> None:
    root = demo[0]
    lines = cli("transcript", root, "demo", "--last", "2").out.splitlines()
    assert len(lines) == 3 and lines[2].split()[1:3] == ["assistant", "Done"]
    assert lines[1].split()[0] == "21"  # numbered from the start of the transcript
    msgs = cli("transcript", root, "demo", "--json").json()
    assert len(msgs) == 22 and msgs[0]["role"] == "system"
    assert cli("transcript", root, "demo", "--last", "0").out == "no messages\n"
    early = cli("transcript", root, "demo", "--at-seq", "5", "--json").json()
    assert [m["role"] for m in early] == ["system", "user"]


def test_verify_ok_and_tampered() -> None:
    root = FIXTURES / "tamper"
    out = cli("verify", root / "edited", "golden", code=1).out
    assert out.startswith("FAILED  golden")
    assert "hash_mismatch" in out and " 2516 " in out  # the byte offset of line 5
    assert "sessions/golden/log.jsonl" in out  # files are shown relative to ROOT
    rep = cli("verify", root / "snapshot_rehashed", "--all", "--json", code=1).json()
    assert rep["ok"] is False
    assert rep["sessions"][0]["problems"][0]["kind"] == "snapshot_state"


def test_verify_demo_all_ok(demo: tuple[Path, str, str]) -> None:
    out = cli("verify", demo[0], "--all").out
    assert out.startswith("ok      demo  events=40")
    assert out.rstrip().endswith("1 session verified, 0 with errors")
    assert cli("verify", demo[0], "demo", "--json").json()["ok"] is True
    assert "give a SESSION or --all" in cli("verify", demo[0], code=2).err
    assert "not both" in cli("verify", demo[0], "demo", "--all", code=2).err


def test_stats(demo: tuple[Path, str, str]) -> None:
    out = cli("stats", demo[0], "demo").out
    assert "events   40 (seq 1..40)" in out and "feature_pass_updated" in out
    assert "0 snapshots" in out and "0 B in 0 files" in out
    doc = cli("stats", demo[0], "demo", "--json").json()
    assert doc["by_type"]["feature_pass_updated"] == 8 and doc["archive_files"] == 0


def test_export(demo: tuple[Path, str, str]) -> None:
    root = demo[0]
    doc = cli("export", root, "demo").json()
    assert doc["last_seq"] == 40 and len(doc["transcript"]) == 22
    raw = cli("export", root, "demo", "--format", "jsonl").out
    assert raw == SessionPaths(root, "demo").log.read_text(encoding="utf-8")


def test_import_legacy(tmp_path: Path) -> None:
    root = tmp_path / "store"
    out = cli("import-legacy", root, FIXTURES / "legacy").out
    assert "3 imported, 0 skipped, 0 failed (3 files in" in out and "sesión-ünïcode ✓/日本" in out
    again = cli("import-legacy", root, FIXTURES / "legacy", "--json").json()
    assert (again["imported"], again["skipped"]) == (0, 3)
    assert "no legacy directory" in cli("import-legacy", root, tmp_path / "nowhere", code=2).err


def test_repair(tmp_path: Path) -> None:
    root = tmp_path / "store"
    install(root, "torn_line.jsonl")
    assert "action          truncated" in cli("repair", root, "golden").out
    install(root, "corrupt_middle.jsonl")
    rep = cli("repair", root, "golden", "--json").json()
    assert rep["action"] == "moved_aside" and Path(rep["moved_to"]).exists()
    assert rep["kept_events"] == 9
    cli("verify", root, "golden")
    assert "action          none" in cli("repair", root, "golden").out


def test_compact_many_with_a_corrupt_one(tmp_path: Path) -> None:
    """A store of 50 sessions, one corrupt and one too small: the others are compacted,
    the corrupt one is reported with where it broke, and the exit status says so."""
    root = tmp_path / "store"
    for i in range(48):
        install(root, "complete.jsonl", f"s{i}")
    with SessionStore(root) as store:
        store.append_progress_entry("tiny", make_entry(0))  # below --min-bytes
    install(root, "corrupt_middle.jsonl", "broken")
    dry = cli("compact", root, "--all", "--dry-run", "--min-bytes", "1000").out
    assert "49 would compact, 1 skipped, 0 failed" in dry  # a dry run reads no log whole
    assert "skipped        tiny: below the threshold" in dry and "1 event)" in dry
    out = cli("compact", root, "--all", "--min-bytes", "1000", code=1).out
    assert "48 compacted, 1 skipped, 1 failed" in out
    assert "failed         broken:" in out and "byte" in out
    assert "compacted      s0:" in out  # each session's line, not only the failures
    doc = cli("compact", root, "s0", "s1", "--json").json()
    assert [s["result"] for s in doc["sessions"]] == ["skipped", "skipped"]  # already compact
    cli("verify", root, "s3")
    assert len(list((SessionPaths(root, "s3").archive).iterdir())) == 1
    assert "give SESSION names or --all" in cli("compact", root, code=2).err


def test_compact_min_events(tmp_path: Path) -> None:
    root = tmp_path / "store"
    install(root, "complete.jsonl", "big")
    with SessionStore(root) as store:
        n = store.last_seq("big")
        for i in range(3):
            store.append_progress_entry("small", make_entry(i))
    doc = cli("compact", root, "--all", "--min-events", n, "--dry-run", "--json").json()
    got = {s["session_id"]: (s["result"], s["events_before"]) for s in doc["sessions"]}
    assert got == {"big": ("would compact", n), "small": ("skipped", 3)}
    cli("compact", root, "big")
    # after compaction the live log is one snapshot line: below any threshold > 1
    again = cli("compact", root, "big", "--min-events", "2", "--json").json()
    assert again["sessions"][0]["result"] == "skipped"
    assert again["sessions"][0]["events_before"] == 1


def test_errors_are_one_line_with_exit_2(tmp_path: Path) -> None:
    missing = cli("state", tmp_path / "nope", "demo", code=2)
    assert missing.err.count("\n") == 1 and "no store at" in missing.err
    assert not (tmp_path / "nope").exists()  # a read never creates a store
    root = tmp_path / "store"
    install(root, "corrupt_middle.jsonl")
    unknown = cli("log", root, "nobody", code=2)
    assert "unknown session 'nobody'" in unknown.err
    corrupt = cli("state", root, "golden", code=2)
    assert corrupt.err.count("\n") == 1 and "byte" in corrupt.err and "seq 10" in corrupt.err
    bad_id = cli("log", root, "", code=2)
    assert bad_id.err.count("\n") == 1


def test_migrate_from_a_store_that_is_not_there_is_refused_and_creates_nothing(
    tmp_path: Path,
) -> None:
    """`migrate SRC DST` with a mistyped SRC made an empty store there and reported
    "migrated 0 of 0 session(s)", exit 0: a read of SRC created it. A SRC that is not
    there is a one-line error, exit 2, and neither store is made."""
    src, dst = tmp_path / "typo" / "store", tmp_path / "dst"
    for shown in (src, f"file://{src}"):
        res = cli("migrate", shown, dst, "--all", code=2)
        assert res.err.count("\n") == 1 and "no store at" in res.err
    assert not src.parent.exists() and not dst.exists()


def test_help_has_examples_and_exit_codes() -> None:
    out = cli("--help").out
    assert "examples:" in out and "exit codes:" in out
    for cmd in ("demo", "sessions", "log", "state", "transcript", "verify", "follow", "stats",
                "export", "import-legacy", "repair", "compact", "contexts"):  # fmt: skip
        assert cmd in out
    assert "eventstore log .eventstore demo --type" in cli("log", "--help").out


def test_store_copies_are_independent(demo: tuple[Path, str, str], tmp_path: Path) -> None:
    """The module's demo store is shared: a test that writes works on a copy."""
    root = tmp_path / "store"
    shutil.copytree(demo[0], root)
    cli("compact", root, "demo")
    assert cli("sessions", demo[0], "--json").json()[0]["archive_files"] == 0
    assert cli("sessions", root, "--json").json()[0]["archive_files"] == 1


# -- what a new user met (issue 29) ---------------------------------------------------------


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("force", [[], ["--force"]])
def test_compact_dry_run_skips_a_log_that_is_one_snapshot_as_the_real_run_does(
    tmp_path: Path, force: list[str]
) -> None:
    """Broken (issue 29): `compact --all --dry-run` said it "would compact" a session
    that is already one snapshot, which the real run skips. The head tells a lone
    snapshot from a lone event (what the next line chains to), so the dry run says
    the same as the real run, still without reading a log."""
    root = tmp_path / "store"
    install(root, "complete.jsonl", "big")
    install(root, "complete.jsonl", "fresh")
    cli("compact", root, "big")
    with SessionStore(root) as store:
        store.append_progress_entry("one", make_entry(0))  # one line, not a snapshot
    before = _tree(root)
    dry = cli("compact", root, "--all", "--dry-run", *force, "--json").json()
    assert _tree(root) == before
    real = cli("compact", root, "--all", *force, "--json").json()
    dry_of = {s["session_id"]: (s["result"], s["skipped"]) for s in dry["sessions"]}
    real_of = {s["session_id"]: (s["result"], s["skipped"]) for s in real["sessions"]}
    assert dry_of["big"] == real_of["big"] == ("skipped", "one_snapshot")
    assert dry_of["fresh"] == ("would compact", None) and real_of["fresh"][0] == "compacted"
    text = cli("compact", root, "big", "--dry-run").out
    assert "skipped        big: the log is already one snapshot" in text


def test_compact_dry_run_in_the_library_writes_nothing_and_says_what_it_would_do(
    tmp_path: Path,
) -> None:
    """`compact(dry_run=True)` builds the snapshot as a compaction would (so it knows a
    snapshot that would not be smaller), and writes nothing."""
    root = tmp_path / "store"
    install(root, "complete.jsonl", "fresh")
    with SessionStore(root) as store:
        store.append_progress_entry("one", make_entry(0))
        before = _tree(root)
        rep = store.compact("fresh", dry_run=True)
        assert rep.dry_run and not rep.compacted and rep.skipped is None
        assert rep.bytes_after < rep.bytes_before
        assert store.compact("one", dry_run=True).skipped == "would_not_shrink"
        assert _tree(root) == before
        assert store.compact("fresh").bytes_after == rep.bytes_after


def test_prune_archive_before_past_the_end_is_refused_naming_the_last_archived_seq(
    tmp_path: Path,
) -> None:
    """Broken (issue 29): `compact --prune-archive-before 99999` silently removed the
    whole archive. A value past the end of the history is refused for that session
    before anything changes, naming where the archive ends; the seq after the last
    event prunes all of it, explicitly."""
    root = tmp_path / "store"
    install(root, "complete.jsonl", "s")
    with SessionStore(root) as store:
        last = store.last_seq("s")
    cli("compact", root, "s")
    before = _tree(root)
    res = cli("compact", root, "s", "--prune-archive-before", "99999", code=1)
    assert f"its archive ends at seq {last}" in res.out and f"at most {last + 1}" in res.out
    assert "nothing was changed" in res.out
    assert _tree(root) == before
    cli("compact", root, "s", "--prune-archive-before", last + 1)
    with SessionStore(root) as store:
        assert store.first_kept_seq("s") == last + 1


def test_log_after_pruning_starts_at_the_first_kept_event_as_follow_does(
    tmp_path: Path,
) -> None:
    """Broken (issue 29): after pruning, `log` exited 2 asking for --from-seq while
    `follow` started at the first kept event. Now `log` starts there too, and says so
    on stderr; an explicit --from-seq below it is still refused."""
    root = tmp_path / "store"
    install(root, "complete.jsonl", "s")
    with SessionStore(root) as store:
        last = store.last_seq("s")
        store.compact("s")
        store.append_progress_entry("s", make_entry(1))
        store.prune_archive("s", last + 1)
        kept = store.first_kept_seq("s")
    res = cli("log", root, "s", "--json")
    assert [e["seq"] for e in res.jsonl()][0] == kept
    assert f"events 1..{kept - 1}" in res.err and f"from seq {kept}" in res.err
    assert f"--from-seq {kept}" in cli("log", root, "s", "--from-seq", 1, code=2).err


def test_verify_problem_table_is_aligned_without_full(monkeypatch: pytest.MonkeyPatch) -> None:
    """Broken (issue 29): without --full the header was indented and the rows were not.
    Every line of the table starts at the same column, and its columns line up."""
    for columns in ("200", "80"):
        monkeypatch.setenv("COLUMNS", columns)
        for full in ([], ["--full"]):
            out = cli("verify", FIXTURES / "tamper" / "edited", "golden", *full, code=1).out
            header, *rows = out.splitlines()[1:]
            assert rows and all(line.startswith("  ") and line[2] != " " for line in rows)
            assert header.startswith("  SEVERITY")
            for name in ("FILE", "KIND", "MESSAGE"):
                col = header.index(name)
                assert all(line[col - 1] == " " and line[col] != " " for line in rows), out
            if not full:
                assert all(len(line) <= int(columns) for line in out.splitlines())


def test_report_into_a_missing_directory_names_it(
    demo: tuple[Path, str, str], tmp_path: Path
) -> None:
    """Broken (issue 29): `report -o /missing-dir/x.html` showed an internal temporary
    file's name. Now the error names the directory, and nothing is written."""
    root, _, _ = demo
    sid = cli("sessions", root, "--json").json()[0]["session_id"]
    target = tmp_path / "missing-dir" / "x.html"
    err = cli("report", root, sid, "-o", target, code=2).err
    assert f"{target.parent} does not exist" in err and ".tmp" not in err
    one_line_error(err)
    (tmp_path / "file").write_text("")
    err = cli("report", root, sid, "-o", tmp_path / "file" / "x.html", code=2).err
    assert "is not a directory" in err
    assert not (tmp_path / "missing-dir").exists()


def test_sessions_one_level_too_deep_hints_the_store(demo: tuple[Path, str, str]) -> None:
    """Broken (issue 29): `eventstore sessions store/sessions` said "no sessions" with
    no hint. Now a hint names the store (and for a session's own folder too)."""
    root, _, _ = demo
    res = cli("sessions", root / "sessions")
    assert "no sessions" in res.out
    assert f"the store is {root}" in res.err and f"eventstore sessions {root}" in res.err
    sid = cli("sessions", root, "--json").json()[0]["session_id"]
    assert f"the store is {root}" in cli("sessions", root / "sessions" / sid).err
    assert not (root / "sessions" / "sessions").exists()  # nothing was created
    assert cli("sessions", root).err == ""
