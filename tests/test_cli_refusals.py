"""The `eventstore` command as a new user meets it (issue 13): clear refusals with exit 2,
honest wording, no symlink followed, no log read whole to decide, one bad session never
hiding the others, output fitted to the terminal, custom event types, `follow --wait`.
In-process through `main(argv)`."""

from __future__ import annotations

import contextlib
import io
import os
import select
import shlex
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from importlib.metadata import EntryPoint
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from conftest import LOGS, cli_in_process, make_entry, make_features, make_manifest, one_line_error
from test_cli import cli, install

import eventstore
from eventstore import (
    SessionStore,
)
from eventstore.cli import store as cli_store
from eventstore.cli.app import (
    build_parser,
    main,
)
from eventstore.cli.compact import Progress
from eventstore.cli.format import display_width
from eventstore.engines.file.layout import SessionPaths


@pytest.fixture(autouse=True)
def wide(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")


@pytest.fixture
def demo(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    cli("demo", "--root", root)
    return root


# -- no arguments, --version, the help's own examples --------------------------------


def test_no_arguments_prints_the_help() -> None:
    res = cli(code=0)
    assert res.out.startswith("usage: eventstore") and "examples:" in res.out
    assert "exit codes:" in res.out and res.err == ""


def test_version() -> None:
    assert cli("--version").out == f"eventstore {eventstore.__version__}\n"


def test_a_bad_command_or_option_is_a_usage_error() -> None:
    assert "invalid choice: 'nosuchcommand'" in cli("nosuchcommand", code=2).err
    assert "the following arguments are required: COMMAND" in cli("--bogus", code=2).err


def test_every_help_fits_80_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    parser = build_parser()
    commands = [a for a in parser._subparsers._group_actions] if parser._subparsers else []
    names = [name for action in commands for name in getattr(action, "choices", {})]
    assert len(names) >= 13
    for argv in (["--help"], *([name, "--help"] for name in names)):
        out = cli(*argv).out
        too_long = [line for line in out.splitlines() if display_width(line) > 79]
        assert not too_long, (argv, too_long)


def _help_examples() -> list[str]:
    """Every `eventstore ...` example line of the top-level and per-command help."""
    parser = build_parser()
    texts = [parser.epilog or ""]
    for action in parser._subparsers._group_actions if parser._subparsers else []:
        for sub in getattr(action, "choices", {}).values():
            texts.append(sub.epilog or "")
    examples: list[str] = []
    for text in texts:
        for line in text.splitlines():
            line = line.strip()
            if not line.startswith("eventstore "):
                continue
            line = line.split("  ")[0]  # the top-level list has a description after it
            line = line.split("#")[0].split("|")[0].split(">")[0].strip()
            examples.append(line)
    return examples


# examples that cannot run on a fresh demo store: their stores are elsewhere, or they
# run until stopped (follow is exercised in test_follow_* and tests/test_cli_smoke.py,
# serve in tests/test_report_serve.py)
NOT_ON_A_DEMO = (
    "eventstore follow",
    "eventstore serve",
    "eventstore contexts",
    "eventstore import-legacy",
    "eventstore import-claude-code",
    "eventstore init-db",  # their servers are examples: tests/test_postgres.py runs both
    "eventstore migrate",
    "eventstore seal",  # needs a key file: tests/test_seal.py runs it
)


def test_every_help_example_runs_on_a_fresh_demo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    cli("demo")
    cli("demo", "--session", "other")  # `compact .eventstore demo other`
    examples = _help_examples()
    assert len(examples) >= 20
    ran = 0
    for example in examples:
        if example.startswith(NOT_ON_A_DEMO):
            continue
        res = cli(*shlex.split(example)[1:], code=None)
        assert res.code == 0, (example, res.out, res.err)
        ran += 1
    assert ran >= 15
    assert "as of seq 10" in cli("state", ".eventstore", "demo", "--at-seq", "10").out


# -- unknown sessions, bad roots -----------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["log"], ["state"], ["transcript"], ["stats"], ["export"], ["repair"], ["verify"],
        ["follow"], ["compact"], ["compact", "demo"],
    ],
)  # fmt: skip
def test_an_unknown_session_is_exit_2_everywhere(demo: Path, argv: list[str]) -> None:
    args = [argv[0], demo, *argv[1:], "nosuch"]
    res = cli(*args, code=2)
    assert "unknown session 'nosuch'" in res.err and res.err.count("\n") == 1
    if argv == ["compact", "demo"]:  # nothing was compacted before the refusal
        assert cli("sessions", demo, "--json").json()[0]["archive_files"] == 0


@pytest.mark.parametrize(
    ("sid", "code", "says"),
    [
        ("never", 2, "unknown session 'never'"),
        ("purged", 2, "unknown session 'purged'"),
        ("tomb", 0, "ok      tomb"),
        ("live", 0, "ok      live"),
        ("a\x00b", 2, "session id 'a\\x00b' contains a NUL character"),
        ("x" * 1100, 2, "session id is 1100 bytes of UTF-8; the limit is 1024"),
    ],
)
def test_verify_of_a_never_written_deleted_purged_or_invalid_id_on_every_engine(
    url: str, sid: str, code: int, says: str
) -> None:
    """Attack: `verify` (asking the API now, not a listing) of an id never written, one
    purged, one tombstoned, and ids the API refuses, on every engine: unknown and
    purged ids are exit 2 naming them, a tombstoned one verifies (its tombstone is what
    is stored), a bad id is its typed one-line error (exit 2), and nothing is written
    (held)."""
    with SessionStore(url) as store:
        for name in ("tomb", "purged", "live"):
            store.append_progress_entry(name, make_entry(0))
        store.delete_session("tomb")
        store.delete_session("purged", purge=True)
    res = cli("verify", url, sid, code=code)
    assert says in (res.out if code == 0 else res.err)
    if code == 2:
        one_line_error(res.err)
    with SessionStore(url) as store:
        assert sorted(store.list_sessions()) == ["live"]
        assert [t.session_id for t in store.deleted_sessions()] == ["tomb"]


@pytest.mark.parametrize(
    "argv",
    [
        ["log"], ["state"], ["state", "--at-seq", "1"], ["transcript"],
        ["transcript", "--at-time", "2026-01-01T00:00:00Z"], ["stats"], ["export"],
        ["export", "--format", "jsonl"], ["export", "--format", "claude-code"], ["repair"],
        ["verify"], ["follow"], ["follow", "--from-seq", "1"],
    ],
)  # fmt: skip
def test_every_one_session_command_says_unknown_of_a_never_written_id_on_every_engine(
    url: str, argv: list[str]
) -> None:
    """Attack: every one-session command, on every engine, given an id nothing of which
    is stored (asked of the store, not of a listing, since verify's fix): the same
    "unknown session 'ID' in ROOT" (exit 2, one line; `export --format claude-code`
    said "no session" its own way), and nothing is written."""
    with SessionStore(url) as store:
        store.append_progress_entry("live", make_entry(0))
    res = cli(argv[0], url, "never-written", *argv[1:], code=2)
    assert f"unknown session 'never-written' in {url} (see: eventstore sessions" in res.err
    one_line_error(res.err)
    with SessionStore(url) as store:
        assert store.list_sessions() == ["live"] and store.last_seq("never-written") == 0


@pytest.mark.parametrize("json_out", [False, True])
def test_verify_all_passes_over_a_session_purged_after_the_listing(
    url: str, json_out: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: a session purged between `verify --all`'s listing and its turn was a
    FAILED "unreadable" session (exit 1) though nothing of it is stored any more, as a
    later listing would show. It is named as gone since the listing, and is no failure
    (exit 0) when the others verify."""
    with SessionStore(url) as store:
        for name in ("a", "b", "c"):
            store.append_progress_entry(name, make_entry(0))
    listing = SessionStore.list_sessions

    def listed_then_purged(self: SessionStore, prefix: str | None = None) -> list[str]:
        ids = listing(self, prefix)
        self.delete_session("b", purge=True)  # (another process, just after the listing)
        return ids

    monkeypatch.setattr(SessionStore, "list_sessions", listed_then_purged)
    res = cli("verify", url, "--all", *(["--json"] if json_out else []), code=0)
    if json_out:
        doc = res.json()
        assert doc["ok"] is True and doc["gone"] == ["b"]
        assert [r["session_id"] for r in doc["sessions"]] == ["a", "c"]
    else:
        lines = res.out.splitlines()
        assert [line.split()[:2] for line in lines[:3]] == [["ok", "a"], ["ok", "c"], ["gone", "b"]]
        assert lines[-1] == "2 sessions verified, 0 with errors, 1 gone since the listing"
    assert res.err == ""


def test_a_regular_file_as_root_says_so(tmp_path: Path) -> None:
    f = tmp_path / "notes.txt"
    f.write_text("hello\n")
    res = cli("state", f, "s", code=2)
    assert f"{f} is a file, not a store directory" in res.err
    res = cli("sessions", f / "below", code=2)
    assert "a part of the path is a file" in res.err
    assert f.read_text() == "hello\n"


def test_a_file_url_names_the_same_store(demo: Path) -> None:
    assert cli("sessions", demo.as_uri(), "--json").json()[0]["session_id"] == "demo"
    assert "names a local path" in cli("sessions", "file://elsewhere/x", code=2).err


def test_a_url_password_is_never_printed(monkeypatch: pytest.MonkeyPatch) -> None:
    for url in (
        "postgresql://alice:s3cret@db.example/store",
        "nosuchengine://u:s3cret@h/x?password=s3cret",
    ):
        res = cli("sessions", url, code=2)  # no such engine here, or no server
        assert "s3cret" not in res.err + res.out and res.err.count("\n") == 1

    def unreachable(root: str, **kw: object) -> None:  # an engine error quoting its URL
        raise eventstore.StorageError(f"cannot connect to {root}: connection refused", 111)

    monkeypatch.setattr(cli_store, "open_engine", unreachable)
    res = cli("state", "postgresql://alice:s3cret@db.example/store", "s", code=2)
    assert "s3cret" not in res.err
    assert "cannot connect to postgresql://alice:***@db.example/store" in res.err


def test_no_command_echoes_the_password_of_a_store_url_it_refuses(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Attack: `delete URL S` of an unknown S, `export URL S --format claude-code` of one,
    and `contexts URL` printed the URL with its password (each wrote its own error line
    from the ROOT as given). Every such line now shows it as `***`."""
    parts = urlsplit(url)
    if parts.scheme in ("", "memory"):
        pytest.skip("a file or memory store has no password")
    netloc = f"{parts.username or ''}:s3cr3t-pw@{parts.hostname}:{parts.port}"
    secret_url = urlunsplit(parts._replace(netloc=netloc))
    for argv in (
        ["delete", secret_url, "nosuch"],
        ["export", secret_url, "nosuch", "--format", "claude-code"],
        ["contexts", secret_url],
    ):
        rc, out, err = cli_in_process(capsys, *argv)
        assert rc == 2 and "s3cr3t-pw" not in out + err, (argv, err)


# -- specific refusals ---------------------------------------------------------------


@pytest.mark.parametrize("command", ["follow", "import-claude-code"])
@pytest.mark.parametrize("interval", ["0", "-1", "nan", "inf", "soon", "1e-320", "0.0009"])
def test_a_poll_interval_below_a_millisecond_is_refused(
    demo: Path, tmp_path: Path, command: str, interval: str
) -> None:
    """--interval 1e-320 was taken: follow then re-read the log in a loop, a core spinning."""
    args = ["demo"] if command == "follow" else [tmp_path / "t.jsonl", "--follow"]
    res = cli(command, demo, *args, "--interval", interval, code=2)
    assert "--interval" in res.err and ">= 0.001" in res.err


def test_export_jsonl_with_json_is_refused(demo: Path) -> None:
    res = cli("export", demo, "demo", "--format", "jsonl", "--json", code=2)
    assert "--json and --format jsonl" in res.err and res.out == ""


def test_log_type_bogus_names_the_known_types(demo: Path) -> None:
    res = cli("log", demo, "demo", "--type", "bogus", code=2)
    assert "unknown event type 'bogus'" in res.err
    for known in ("manifest_set", "progress_appended", "messages_appended", "snapshot"):
        assert known in res.err
    assert "--event-types" in res.err


# -- wording -------------------------------------------------------------------------


def test_plurals_and_the_manifest_summary(tmp_path: Path) -> None:
    root = tmp_path / "store"
    with SessionStore(root) as store:
        store.initialize_session_if_missing(
            "s", make_manifest("s"), make_features(1), initial_progress_entry=make_entry(1)
        )
        store.record_run_checkpoint("s", eventstore.RunCheckpoint(run_id="r"))
    state = cli("state", root, "s").out
    assert "progress: 1 entry\n" in state and "checkpoints: 1\n" in state
    log = cli("log", root, "s").out
    assert "1 feature (0 passing): f1" in log
    # the objective is named as such; the init steps are counted, not mistaken for it
    assert "objective: make the tests pass — ünïcode (branch main, commit -, 2 init steps)" in log
    stats = cli("stats", root, "s").out
    assert "4 lines, 0 snapshots" in stats and "0 events compacted" in stats


def test_the_demo_prints_its_state_once(tmp_path: Path) -> None:
    out = cli("demo", "--root", tmp_path / "s").out
    assert out.count("features: 4/20 passing") == 1


# -- symlinks, whole reads and bad sessions -------------------------------------------


def test_compact_never_follows_a_linked_log(tmp_path: Path) -> None:
    root = tmp_path / "store"
    install(root, "complete.jsonl", "good")
    victim = tmp_path / "passwd"
    victim.write_bytes(b"root:x:0:0:root:/root:/bin/bash\n" * 24)
    before = victim.read_bytes()
    link = SessionPaths(root, "evil")
    link.create()
    os.symlink(victim, link.log)
    dry = cli("compact", root, "--all", "--dry-run", code=1).out
    assert "would compact  good:" in dry
    assert "failed         evil:" in dry and "would compact  evil" not in dry
    assert "24 lines" not in dry and "1.2 kB" not in dry.split("evil:")[1].splitlines()[0]
    out = cli("compact", root, "--all", code=1).out
    assert "1 compacted, 0 skipped, 1 failed" in out
    assert victim.read_bytes() == before and os.path.islink(link.log)


class _ReadMeter:
    """Counts the bytes read through os.read/os.pread; whole-file readers are refused."""

    def __init__(self, mp: pytest.MonkeyPatch) -> None:
        self.bytes = 0
        real_read, real_pread = os.read, os.pread

        def read(fd: int, n: int) -> bytes:
            data = real_read(fd, n)
            self.bytes += len(data)
            return data

        def pread(fd: int, n: int, off: int) -> bytes:
            data = real_pread(fd, n, off)
            self.bytes += len(data)
            return data

        def refused(*a: object, **k: object) -> None:
            raise AssertionError(f"a whole-file read: {a!r}")

        mp.setattr(os, "read", read)
        mp.setattr(os, "pread", pread)
        mp.setattr(os, "fdopen", refused)
        mp.setattr(Path, "read_bytes", refused)


def test_compact_decides_without_reading_a_log_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "store"
    with SessionStore(root) as store:
        store.initialize_session_if_missing("big", make_manifest("big"), make_features(3))
        for _ in range(200):  # ~4 MB
            store.append_transcript_messages(
                "big", [eventstore.Message(role=eventstore.Role.USER, content="x" * 20_000)]
            )
        size = SessionPaths(root, "big").log.stat().st_size
    assert size > 3_000_000
    meter = _ReadMeter(monkeypatch)
    doc = cli("compact", root, "--all", "--dry-run", "--min-events", "5", "--json").json()
    assert doc["sessions"][0]["result"] == "would compact"
    assert doc["sessions"][0]["bytes_before"] == size
    assert doc["sessions"][0]["events_before"] == 202
    assert meter.bytes < size // 20, meter.bytes


def test_sessions_lists_the_good_ones_past_a_bad_one(tmp_path: Path) -> None:
    root = tmp_path / "store"
    install(root, "complete.jsonl", "a-good")
    install(root, "complete.jsonl", "z-good")
    bad = SessionPaths(root, "m-linked")
    bad.create()
    os.symlink(LOGS / "complete.jsonl", bad.log)
    res = cli("sessions", root, code=1)
    listed = [line.split()[0] for line in res.out.splitlines()[1:]]
    assert listed == ["a-good", "z-good"]
    assert "session 'm-linked' unreadable" in res.err and "1 session of 3" in res.err
    rows = cli("sessions", root, "--json", code=1).json()
    assert [r["session_id"] for r in rows] == ["a-good", "m-linked", "z-good"]
    assert rows[1]["error"] and rows[0]["error"] is None
    # verify --all also goes on past it
    out = cli("verify", root, "--all", code=1).out
    assert "ok      a-good" in out and "ok      z-good" in out and "FAILED  m-linked" in out


# -- the terminal's width ------------------------------------------------------------


@pytest.mark.parametrize("columns", [80, 100, 132])
def test_output_fits_the_terminal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, columns: int
) -> None:
    root = tmp_path / "store"
    cli("demo", "--root", root)
    install(root, "corrupt_middle.jsonl", "bad")
    monkeypatch.setenv("COLUMNS", str(columns))
    outputs = {
        "log": cli("log", root, "demo").out,
        "verify": cli("verify", root, "bad", code=1).out,
        "state": cli("state", root, "demo").out,
        "transcript": cli("transcript", root, "demo").out,
    }
    for name, out in outputs.items():
        lines = out.splitlines()
        assert lines
        too_long = [line for line in lines if display_width(line) > columns]
        if name == "verify":  # the header line names the head hash in full
            too_long = [line for line in too_long if not line.startswith("FAILED")]
        assert not too_long, (name, columns, too_long)
    # --full keeps everything whole, however narrow the terminal
    full = cli("log", root, "demo", "--full").out
    assert "every feature in the list passes end to end" in full


def test_the_terminal_width_is_read_on_a_tty(monkeypatch: pytest.MonkeyPatch) -> None:
    from eventstore.cli import format as cli_format

    monkeypatch.delenv("COLUMNS")

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

        def fileno(self) -> int:
            return 1

    monkeypatch.setattr(sys, "stdout", Tty())
    monkeypatch.setattr(os, "get_terminal_size", lambda fd: os.terminal_size((73, 20)))
    assert cli_format.terminal_width() == 73
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    assert cli_format.terminal_width() == cli_format.DEFAULT_WIDTH


# -- the compact progress bar --------------------------------------------------------


def test_the_progress_bar_keeps_every_session_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "store"
    for i in range(5):
        install(root, "complete.jsonl", f"s{i}")
    capsys.readouterr()
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert main(["compact", str(root), "--all"]) == 0
    out, err = capsys.readouterr()
    assert [line.split()[1] for line in out.splitlines()[:5]] == [f"s{i}:" for i in range(5)]
    assert "5 compacted, 0 skipped, 0 failed" in out
    assert "[" in err and "5/5" in err  # the bar ran on stderr...
    assert err.endswith("\r")  # ...and was cleared at the end


def test_progress_lines_appear_above_the_bar() -> None:
    err = io.StringIO()
    out = io.StringIO()
    bar = Progress(2, True, err)
    with contextlib.redirect_stdout(out):
        bar.update(0, "a")
        bar.line("compacted a")
        bar.update(1, "b")
        bar.line("compacted b")
        bar.close()
    assert out.getvalue() == "compacted a\ncompacted b\n"
    # before each line the bar is wiped; after it the bar is drawn again
    assert err.getvalue().count("\r" + " " * 10) >= 3


# -- custom event types --------------------------------------------------------------

CUSTOM = textwrap.dedent(
    """
    from eventstore import Event

    class FlipCounted(Event, tag="flip_counted", kw_only=True):
        run_id: str

    class TaskAdded(Event, tag="task_added", kw_only=True):
        name: str

    ALL = [FlipCounted, TaskAdded]
    NOT_EVENTS = [int]
    """
)


@pytest.fixture
def custom(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A store with two custom event types, written by a module on sys.path."""
    (tmp_path / "mod").mkdir()
    (tmp_path / "mod" / "my_events.py").write_text(CUSTOM)
    monkeypatch.syspath_prepend(str(tmp_path / "mod"))
    import my_events  # type: ignore[import-not-found]

    root = tmp_path / "store"
    with SessionStore(root, event_types=my_events.ALL) as store:
        store.initialize_session_if_missing("s", make_manifest("s"), make_features(2))
        store.append("s", [my_events.FlipCounted(run_id="r1"), my_events.TaskAdded(name="t")])
    yield root
    sys.modules.pop("my_events", None)


def test_custom_event_types_unknown_without_help(custom: Path) -> None:
    log = cli("log", custom, "s").out
    assert "(unknown type 'flip_counted'; load it with --event-types)" in log
    out = cli("verify", custom, "s").out
    assert "warnings=2" in out and "unknown" in out
    assert (
        "unknown event type 'flip_counted'"
        in cli("log", custom, "s", "--type", "flip_counted", code=2).err
    )


def test_custom_event_types_from_the_option(custom: Path) -> None:
    opt = ["--event-types", "my_events:ALL"]
    log = cli("log", custom, "s", *opt).out
    assert '{"run_id":"r1"}' in log and '{"name":"t"}' in log and "unknown" not in log
    assert "warnings=0" in cli("verify", custom, "s", *opt).out
    flips = cli("log", custom, "s", "--type", "flip_counted", "--json", *opt).jsonl()
    assert [e["run_id"] for e in flips] == ["r1"]
    one = cli("log", custom, "s", "--event-types", "my_events:FlipCounted").out
    assert '{"run_id":"r1"}' in one and "(unknown type 'task_added'" in one
    assert "features: 0/2 passing" in cli("state", custom, "s", *opt).out
    assert "(seq 1..4)" in cli("stats", custom, "s", *opt).out


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("my_events", "wants MODULE:ATTR"),
        ("no_such_module_xyz:X", "cannot import 'no_such_module_xyz'"),
        ("my_events:Nope", "has no 'Nope'"),
        ("my_events:NOT_EVENTS", "is not an Event subclass"),
        ("my_events:CUSTOM_MISSING", "has no"),
    ],
)
def test_bad_event_type_specs_are_refused(custom: Path, spec: str, message: str) -> None:
    res = cli("log", custom, "s", "--event-types", spec, code=2)
    assert message in res.err and res.err.count("\n") == 1


def test_custom_event_types_from_an_entry_point(
    custom: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    group = cli_store.ENTRY_POINT_GROUP
    eps = [EntryPoint("mine", "my_events:ALL", group)]
    monkeypatch.setattr(
        cli_store, "entry_points", lambda group: eps if group == cli_store.ENTRY_POINT_GROUP else []
    )
    assert "warnings=0" in cli("verify", custom, "s").out
    eps[:] = [EntryPoint("broken", "my_events:Missing", group)]
    assert (
        "entry point broken (my_events:Missing) failed to load"
        in cli("log", custom, "s", code=2).err
    )


# -- follow --------------------------------------------------------------------------


class _Sink(io.TextIOWrapper):
    """stdout that another thread may poll."""

    def __init__(self) -> None:
        super().__init__(io.BytesIO(), encoding="utf-8", write_through=True)
        self.lock = threading.Lock()

    def text(self) -> str:
        with self.lock:
            return self.buffer.getvalue().decode("utf-8")  # type: ignore[attr-defined]


def _follow_in_process(argv: list[str], writer: object) -> tuple[int, str]:
    """Run `main(argv)` (a follow) in this thread; `writer(sink)` runs in another thread
    and returns once it has seen what it waited for; then SIGINT stops the follow."""
    sink = _Sink()

    def drive() -> None:
        try:
            writer(sink)  # type: ignore[operator]
        finally:
            time.sleep(0.05)
            os.kill(os.getpid(), signal.SIGINT)

    t = threading.Thread(target=drive)
    with contextlib.redirect_stdout(sink):
        t.start()
        rc = main(argv)
    t.join()
    return rc, sink.text()


def _wait_for(sink: _Sink, text: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while text not in sink.text():
        assert time.monotonic() < deadline, (text, sink.text())
        time.sleep(0.02)


def test_follow_waits_for_a_session_that_does_not_exist_yet(tmp_path: Path) -> None:
    root = tmp_path / "store"
    root.mkdir()
    assert "--wait" in cli("follow", root, "later", code=2).err

    def writer(sink: _Sink) -> None:
        time.sleep(0.2)
        with SessionStore(root) as store:
            store.initialize_session_if_missing("later", make_manifest("later"), make_features(2))
            store.append_progress_entry("later", make_entry(7, run_id="run-late"))
        _wait_for(sink, "[run-late] step 7")

    rc, out = _follow_in_process(
        ["follow", str(root), "later", "--wait", "--interval", "0.02"], writer
    )
    assert rc == 0
    assert [line.split()[0] for line in out.splitlines()] == ["1", "2", "3"]


def test_follow_prints_the_last_ten_then_new_events(demo: Path) -> None:
    def writer(sink: _Sink) -> None:
        _wait_for(sink, "\n")
        with SessionStore(demo) as store:
            store.append_progress_entry("demo", make_entry(1, run_id="run-follow"))
        _wait_for(sink, "[run-follow] step 1")

    # whatever the runner had (a shell's background job starts with SIGINT ignored)
    before = signal.getsignal(signal.SIGINT)
    rc, out = _follow_in_process(["follow", str(demo), "demo", "--interval", "0.02"], writer)
    assert rc == 0
    assert [int(line.split()[0]) for line in out.splitlines()] == list(range(12, 23))
    assert signal.getsignal(signal.SIGINT) is before  # restored


# -- store URLs ----------------------------------------------------------------------


def test_the_commands_work_on_a_memory_store() -> None:
    """`memory://NAME` is one store shared by name inside a process: in-process, every
    command reaches the same one, through the same open_store as a directory."""
    url = "memory://cli-test-store"
    assert (
        "wrote a new demo session 'demo' in memory://cli-test-store"
        in cli("demo", "--root", url).out
    )
    assert cli("sessions", url, "--json").json()[0]["last_seq"] == 21
    assert len(cli("log", url, "demo").out.splitlines()) == 22
    assert "features: 4/20 passing" in cli("state", url, "demo").out
    assert cli("verify", url, "--all").out.startswith("ok      demo  events=21")
    assert "1 compacted, 0 skipped, 0 failed" in cli("compact", url, "demo").out
    assert "events   21 (seq 1..21)" in cli("stats", url, "demo").out
    assert len(cli("export", url, "demo", "--format", "jsonl").out.splitlines()) == 21
    assert "unknown session 'nosuch'" in cli("state", url, "nosuch", code=2).err


# -- attacks -------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["state", "transcript"])
@pytest.mark.parametrize("at", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-05:00"])
def test_at_time_at_the_edge_of_the_calendar_is_a_one_line_error(
    demo_root: Path, capsys: pytest.CaptureFixture[str], command: str, at: str
) -> None:
    # valid ISO 8601, accepted by the parser; its UTC form is outside datetime's range
    rc, _, err = cli_in_process(capsys, command, str(demo_root), "s1", "--at-time", at)
    assert rc in (0, 2)
    if rc == 2:
        one_line_error(err)


def test_prune_archive_before_the_end_of_time_fails_cleanly(
    demo_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, _, err = cli_in_process(
        capsys,
        "compact",
        str(demo_root),
        "--all",
        "--prune-archive-before",
        "9999-12-31T23:59:00-01:00",
    )
    assert rc in (0, 1, 2)
    assert "Traceback" not in err


@pytest.mark.parametrize("age", ["99999999999999d", "1000000d", "99999999999999999999w"])
def test_delete_older_than_a_huge_age_deletes_nothing_and_says_so(
    demo_root: Path, capsys: pytest.CaptureFixture[str], age: str
) -> None:
    rc, _, err = cli_in_process(capsys, "delete", str(demo_root), "--older-than", age)
    assert rc in (0, 2), err  # nothing is that old, or a usage error
    if rc == 2:
        one_line_error(err)
    with SessionStore(demo_root) as store:
        assert sorted(store.list_sessions()) == ["s1", "s2"]


def test_follow_stops_on_sigterm_whatever_its_interval(demo_root: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "eventstore", "follow", str(demo_root), "s1", "--interval", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        assert ready, "follow printed nothing in 30 s"
        assert proc.stdout.readline().strip()  # the last events: the handlers are installed
        time.sleep(0.5)  # in its wait now
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            rc = None
        waited = time.monotonic() - sent
        assert rc == 0, f"follow --interval 60 still running {waited:.1f} s after SIGTERM"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def test_exports_of_a_damaged_log_print_nothing_that_looks_complete(
    demo_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = demo_root / "sessions" / "s1" / "log.jsonl"
    data = log.read_bytes()
    assert b"feat-000 and feat-001 pass" in data
    log.write_bytes(data.replace(b"feat-000 and feat-001 pass", b"feat-000 and feat-001 FAIL"))
    for fmt in ("json", "jsonl"):
        rc, out, err = cli_in_process(capsys, "export", str(demo_root), "s1", "--format", fmt)
        assert (rc, out) == (2, ""), fmt
        one_line_error(err)
        assert "h is" in err and "seq" in err
