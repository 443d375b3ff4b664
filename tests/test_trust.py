"""Trust (issue 12): a load never returns what failed its check, and no committed byte is
ever thrown away by recovery.

One regression test (or a few) per item of the issue, written against the public API
(`SessionStore`, the `eventstore` command through `eventstore.cli.main`) and the bytes on
disk only, so they hold whatever the internals become. The README's Guarantees section
names these tests.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest
from conftest import (
    every_transcript_load,
    in_forked_child,
    log_path,
    make_entry,
    make_features,
    make_manifest,
    run_threads,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventstore import (
    CorruptLogError,
    EventStoreError,
    FeatureRecord,
    InvalidRecordError,
    InvalidSessionIdError,
    Message,
    ProgressEntry,
    Role,
    SessionManifest,
    SessionStore,
    Snapshot,
    TextBlock,
    UnsafePathError,
)
from eventstore.cli.app import main as cli_main
from eventstore.format.codec import EventCodec
from eventstore.format.events import (
    FeatureListReplaced,
    ManifestSet,
    MessagesAppended,
)
from eventstore.records import BootstrapState, ToolUseBlock
from projections import StructProjection

SID = "s"
TS = datetime(2026, 1, 2, tzinfo=UTC)


def xfail(item: int) -> pytest.MarkDecorator:
    """The marker of a regression test whose fix has not landed yet."""
    return pytest.mark.xfail(strict=True, reason=f"issue 12 item {item}")


# -- helpers: the documented on-disk layout, the CLI -----------------------------------


def session_dir(root: Path, sid: str = SID) -> Path:
    """An ordinary id is its own directory name under `<root>/sessions/` (README)."""
    return root / "sessions" / sid


def log_file(root: Path, sid: str = SID) -> Path:
    return session_dir(root, sid) / "log.jsonl"


def archive_files(root: Path, sid: str = SID) -> list[Path]:
    d = session_dir(root, sid) / "archive"
    return sorted(p for p in d.iterdir() if p.name.endswith(".jsonl")) if d.is_dir() else []


def seeded(root: Path, progress: int = 5, sid: str = SID) -> SessionStore:
    """A store with an initialized session, `progress` progress entries and two messages."""
    s = SessionStore(root)
    s.initialize_session_if_missing(sid, make_manifest(sid), make_features())
    for i in range(progress):
        s.append_progress_entry(sid, make_entry(i))
    s.append_transcript_messages(
        sid, [Message(role=Role.USER, content="hello"), Message(role=Role.ASSISTANT, content="hi")]
    )
    return s


def line_starts(data: bytes) -> list[int]:
    starts = [0]
    for i, b in enumerate(data):
        if b == 0x0A and i + 1 < len(data):
            starts.append(i + 1)
    return starts


def repair(root: Path, sid: str = SID) -> int:
    """`eventstore repair ROOT SESSION`, in-process."""
    with contextlib.redirect_stdout(open(os.devnull, "w")):  # noqa: SIM115
        return cli_main(["repair", str(root), sid])


def files_holding(under: Path, needle: bytes) -> list[Path]:
    """Every regular file under `under` whose bytes contain `needle`."""
    found = []
    for p in under.rglob("*"):
        if p.is_file() and not p.is_symlink() and needle in p.read_bytes():
            found.append(p)
    return found


def fresh_state(root: Path, sid: str = SID) -> tuple[Any, list[Message]]:
    with SessionStore(root) as s:
        return s.load_bootstrap_state(sid), s.load_transcript_messages(sid)


# -- item 1: loads check the hash chain -------------------------------------------------


def _same_length_edit(line: bytes, old: bytes, new: bytes) -> bytes:
    assert len(old) == len(new) and old in line
    return line.replace(old, new, 1)


@pytest.mark.parametrize(
    ("what", "old", "new"),
    [
        ("a letter in a progress summary", b'"step 2"', b'"step X"'),
        ("a digit in a timestamp", b"09:30:02", b"09:30:07"),
        (
            "one letter of a type tag",
            b'"progress_appended","seq":5',
            b'"progress_appendex","seq":5',
        ),
        ("a letter of a message", b'"hello"', b'"jello"'),
    ],
)
def test_item1_load_raises_on_an_edit_that_keeps_the_line_valid(
    tmp_path: Path, what: str, old: bytes, new: bytes
) -> None:
    """An edited line that is still valid JSON is never folded: both loads raise
    CorruptLogError naming the file, the line's byte offset and its seq."""
    root = tmp_path / "store"
    seeded(root).close()
    path = log_file(root)
    data = path.read_bytes()
    at = data.index(old)
    start = data.rfind(b"\n", 0, at) + 1
    seq = msgspec.json.decode(data[start : data.index(b"\n", at)])["seq"]
    path.write_bytes(data[:at] + new + data[at + len(old) :])
    for load in ("load_bootstrap_state", "load_transcript_messages"):
        with SessionStore(root) as s, pytest.raises(CorruptLogError) as info:
            getattr(s, load)(SID)
        assert Path(str(info.value.path)) == path, what
        assert info.value.offset == start, what
        assert info.value.seq == seq, what


def test_item1_lines_appended_since_a_cached_load_are_checked(tmp_path: Path) -> None:
    """A store that cached a folded state checks what it folds on top of it: a line
    another process appended and someone then edited is refused."""
    root = tmp_path / "store"
    reader = seeded(root)
    reader.load_bootstrap_state(SID)  # cached, at the current end of the log
    with SessionStore(root) as writer:
        writer.append_progress_entry(SID, ProgressEntry(run_id="r", summary="fresh"))
    path = log_file(root)
    path.write_bytes(path.read_bytes().replace(b'"fresh"', b'"fresH"'))
    with pytest.raises(CorruptLogError):
        reader.load_bootstrap_state(SID)
    reader.close()


_ITEM1_LOG: dict[str, bytes] = {}


def _item1_log(tmp: Path) -> bytes:
    if "data" not in _ITEM1_LOG:
        seeded(tmp / "seed", progress=3).close()
        _ITEM1_LOG["data"] = log_file(tmp / "seed").read_bytes()
    return _ITEM1_LOG["data"]


@pytest.mark.slow
@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(pos=st.integers(min_value=0), byte=st.integers(min_value=0x20, max_value=0x7E))
def test_item1_any_byte_changed_inside_a_committed_line_fails_both_loads(
    tmp_path: Path, pos: int, byte: int
) -> None:
    """Property: change any byte of a committed log (but its newlines, item 2's case) to
    any printable byte; both loads raise CorruptLogError, never return a state."""
    data = _item1_log(tmp_path)
    pos %= len(data)
    if data[pos] == 0x0A or data[pos] == byte:
        return
    root = tmp_path / f"case-{pos}-{byte}"
    SessionStore(root).close()
    session_dir(root).mkdir(parents=True, mode=0o700)
    log_file(root).write_bytes(data[:pos] + bytes([byte]) + data[pos + 1 :])
    try:
        for load in ("load_bootstrap_state", "load_transcript_messages"):
            with SessionStore(root) as s, pytest.raises(CorruptLogError):
                getattr(s, load)(SID)
    finally:
        shutil.rmtree(root, ignore_errors=True)


# -- item 2: a damaged final newline; what recovery cuts off is kept ---------------------


@pytest.mark.parametrize("byte", [b" ", b"x", b"\x00"])
def test_item2_damaged_final_newline_is_corruption_not_a_torn_tail(
    tmp_path: Path, byte: bytes
) -> None:
    """The last newline of a committed log replaced by another byte: the line still
    decodes and its `h` checks, so it is a committed batch that was damaged. Loads raise,
    verify reports an error, the next writer refuses, and nothing is truncated."""
    root = tmp_path / "store"
    seeded(root).close()
    path = log_file(root)
    data = path.read_bytes()
    damaged = data[:-1] + byte
    path.write_bytes(damaged)
    with SessionStore(root) as s:
        with pytest.raises(CorruptLogError):
            s.load_transcript_messages(SID)
        report = s.verify(SID)
        assert not report.ok
        assert any(p.severity == "error" and Path(p.file) == path for p in report.problems)
        with pytest.raises(CorruptLogError):
            s.append_progress_entry(SID, make_entry(99))
    assert path.read_bytes() == damaged


def test_item2_repair_of_a_damaged_final_newline_destroys_no_committed_byte(
    tmp_path: Path,
) -> None:
    root = tmp_path / "store"
    seeded(root).close()
    path = log_file(root)
    data = path.read_bytes()
    last = data[data.rfind(b"\n", 0, len(data) - 1) + 1 : -1]
    path.write_bytes(data[:-1] + b"x")
    repair(root)
    assert files_holding(session_dir(root), last), "the committed last line was destroyed"


@pytest.mark.parametrize("who", ["writer", "repair"])
def test_item2_a_torn_tail_cut_by_recovery_is_saved_aside_first(tmp_path: Path, who: str) -> None:
    """A real torn tail (half a line, as a crash leaves it): whoever truncates it, the
    next writer or `repair`, first saves the bytes beside the log."""
    root = tmp_path / "store"
    seeded(root).close()
    path = log_file(root)
    torn = b'{"type":"progress_appended","seq":9,"ts":"2026-11-29T15:40:00.1Z","entry":{"ru'
    with open(path, "ab") as f:
        f.write(torn)
    if who == "writer":
        with SessionStore(root) as s:
            s.append_progress_entry(SID, make_entry(7))
    else:
        repair(root)
    assert torn not in path.read_bytes()
    kept = files_holding(session_dir(root), torn)
    assert kept, "the torn bytes were destroyed"
    assert all(p.name.startswith("log.jsonl.torn-") for p in kept), kept


# -- item 3: history readers see one consistent picture -----------------------------------

_APPEND_AND_COMPACT = r"""
import sys, time
from eventstore import SessionStore, ProgressEntry, Message, Role
root, seconds = sys.argv[1], float(sys.argv[2])
s = SessionStore(root)
print("ready", flush=True)
end = time.monotonic() + seconds
i = 0
while time.monotonic() < end:
    i += 1
    s.append_transcript_messages("s", [Message(role=Role.USER, content="m%d " % i + "x" * 2000)])
    if i % 3 == 0:
        s.compact("s", force=True)
"""


@pytest.mark.slow
def test_item3_history_reads_beside_a_compacting_writer_see_one_picture(tmp_path: Path) -> None:
    """Another process appends and compacts in a loop (archive kept); meanwhile every
    `verify` is clean and every `read_events` yields 1..N, each once, with no snapshot
    standing in for archived events."""
    root = tmp_path / "store"
    with SessionStore(root) as s:
        for i in range(400):  # a large log: the window between listing and reading is wide
            s.append_transcript_messages(
                SID, [Message(role=Role.USER, content=f"seed {i} " + "y" * 4000)]
            )
    proc = subprocess.Popen(
        [sys.executable, "-c", _APPEND_AND_COMPACT, str(root), "8"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    failures: list[str] = []
    try:
        with SessionStore(root) as s:
            while proc.poll() is None and len(failures) < 3:
                report = s.verify(SID)
                if not report.ok:
                    failures.append(f"verify: {report.problems}")
                seqs = []
                for ev in s.read_events(SID):
                    if type(ev) is Snapshot:
                        failures.append(f"read_events yielded a snapshot at {ev.seq}")
                        break
                    seqs.append(ev.seq)
                if seqs != list(range(1, len(seqs) + 1)):
                    failures.append(f"read_events: gap or repeat near {_first_gap(seqs)}")
    finally:
        proc.kill()
        proc.wait()
    assert not failures, failures


def _first_gap(seqs: list[int]) -> int:
    for i, q in enumerate(seqs, 1):
        if q != i:
            return i
    return len(seqs)


# -- item 4: nothing outside the root is read, renamed or written ------------------------


def _snapshot_tree(path: Path) -> dict[str, tuple[int, bytes]]:
    return {
        str(p.relative_to(path)): (p.lstat().st_ino, p.read_bytes() if p.is_file() else b"")
        for p in sorted(path.rglob("*"))
    }


def test_item4_compact_renames_nothing_through_a_planted_archive_link(tmp_path: Path) -> None:
    root = tmp_path / "store"
    seeded(root).close()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "000000000001-000000000002.jsonl.pending").write_bytes(b"precious\n")
    (outside / "keep.txt").write_bytes(b"mine\n")
    before = _snapshot_tree(outside)
    (session_dir(root) / "archive").symlink_to(outside)
    with SessionStore(root) as s, pytest.raises(UnsafePathError):
        s.compact(SID, force=True)
    assert _snapshot_tree(outside) == before


class ProgressCount(StructProjection[int]):
    """Counts progress entries; its `version` is what the test bumps."""

    name = "progress_count"
    version = 1
    event_types: frozenset[str] | None = frozenset({"progress_appended"})
    state_type = int

    def initial(self) -> int:
        return 0

    def apply(self, state: int, event: Any) -> int:
        return state + 1 if getattr(event, "entry", None) is not None else state


class ProgressCountV2(ProgressCount):
    version = 2


def test_item4_a_rebuild_from_the_archive_never_reads_through_a_planted_link(
    tmp_path: Path,
) -> None:
    """A snapshot holding another version of a projection is rebuilt from the archive; the
    archive moved out of the root and linked back in is refused, not read."""
    root = tmp_path / "store"
    with SessionStore(root, projections=[ProgressCount()]) as s:
        s.initialize_session_if_missing(SID, make_manifest(SID), make_features())
        for i in range(3):
            s.append_progress_entry(SID, make_entry(i))
        s.compact(SID, force=True)
    with SessionStore(root, projections=[ProgressCountV2()]) as s:
        assert s.load(SID, "progress_count") == 3  # the rebuild works on a real archive
    outside = tmp_path / "outside"
    shutil.move(str(session_dir(root) / "archive"), outside)
    (session_dir(root) / "archive").symlink_to(outside)
    with SessionStore(root, projections=[ProgressCountV2()]) as s, pytest.raises(UnsafePathError):
        s.load(SID, "progress_count")


# -- item 5: a fork while a thread appends ----------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_item5_a_child_forked_during_an_append_can_append(tmp_path: Path) -> None:
    """A parent thread appends in a loop while the main thread forks; each child appends
    to the same session through the inherited store and exits. None may hang."""
    root = tmp_path / "store"
    store = seeded(root, progress=1)
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            store.append_progress_entry(SID, make_entry(1))

    t = threading.Thread(target=spin)
    t.start()
    hung = failed = 0
    try:
        for _ in range(10):
            time.sleep(0.005)
            code = in_forked_child(
                lambda: store.append_progress_entry(
                    SID, ProgressEntry(run_id="child", summary="c")
                ),
                10,
            )
            hung += code is None
            failed += code is not None and code != 0
    finally:
        stop.set()
        t.join()
        store.close()
    assert hung == 0 and failed == 0, f"{hung} children hung, {failed} failed, of 10"


# -- item 6: verify and read report damage, never crash ----------------------------------


def _merge_lines(data: bytes, k: int, glue: bytes) -> bytes:
    """Lines k and k+1 (0-based) of `data` as one line joined by `glue`."""
    starts = line_starts(data)
    nl = starts[k + 1] - 1
    return data[:nl] + glue + data[nl + 1 :]


@pytest.mark.parametrize("glue", [b" ", b""], ids=["newline-became-space", "two-objects"])
def test_item6_merged_lines_raise_corrupt_log_error_and_verify_reports(
    tmp_path: Path, glue: bytes
) -> None:
    root = tmp_path / "store"
    seeded(root).close()
    path = log_file(root)
    path.write_bytes(_merge_lines(path.read_bytes(), 3, glue))
    with SessionStore(root) as s:
        for call in (
            lambda: s.load_bootstrap_state(SID),
            lambda: s.load_transcript_messages(SID),
            lambda: list(s.read_events(SID)),
            lambda: s.state_at(SID, seq=6),
        ):
            with pytest.raises(CorruptLogError) as info:
                call()
            assert info.value.path is not None
        report = s.verify(SID)
    assert not report.ok
    assert all(p.file for p in report.problems)


def test_item6_a_snapshot_state_that_no_longer_decodes_is_reported_with_its_file(
    tmp_path: Path,
) -> None:
    root = tmp_path / "store"
    with seeded(root) as s:
        s.compact(SID, force=True)
    path = log_file(root)
    data = path.read_bytes()
    assert b'"recent_progress":[' in data
    path.write_bytes(data.replace(b'"recent_progress":[', b'"recent_progress":[1,', 1))
    with SessionStore(root) as s:
        report = s.verify(SID)  # must not raise
    assert not report.ok
    assert all(p.file for p in report.problems)
    assert any(Path(p.file) == path for p in report.problems)


# -- item 7: a short archive is corruption ----------------------------------------------


def _compacted_with_archive(root: Path) -> Path:
    with seeded(root) as s:
        s.compact(SID, force=True)
        s.append_progress_entry(SID, make_entry(50))
    (arch,) = archive_files(root)
    return arch


@pytest.mark.parametrize("cut", ["whole-lines", "mid-line"])
def test_item7_a_truncated_archive_is_corruption_not_a_torn_tail(tmp_path: Path, cut: str) -> None:
    root = tmp_path / "store"
    arch = _compacted_with_archive(root)
    data = arch.read_bytes()
    starts = line_starts(data)
    end = starts[-2] if cut == "whole-lines" else starts[-2] + 20
    arch.write_bytes(data[:end])
    with SessionStore(root) as s:
        with pytest.raises(CorruptLogError):
            list(s.read_events(SID))
        with pytest.raises(CorruptLogError):
            s.state_at(SID, seq=len(starts))
        report = s.verify(SID)
    assert not report.ok
    assert not any(p.kind == "torn_tail" for p in report.problems), report.problems


# -- item 8: mixed compactions ----------------------------------------------------------


def test_item8_archive_then_no_archive_is_a_warning(tmp_path: Path) -> None:
    root = tmp_path / "store"
    with seeded(root) as s:
        s.compact(SID, force=True)
        s.append_progress_entry(SID, make_entry(8))
        s.compact(SID, archive=False, force=True)
        s.append_progress_entry(SID, make_entry(9))
        report = s.verify(SID)
    assert report.ok, report.problems
    assert any(p.severity == "warning" for p in report.problems)


# -- item 9: repair of a damaged snapshot -----------------------------------------------


def test_item9_repair_of_a_damaged_snapshot_rebuilds_from_the_archive(tmp_path: Path) -> None:
    root = tmp_path / "store"
    with seeded(root) as s:
        s.compact(SID, force=True)
        want_state = s.load_bootstrap_state(SID)
        want_msgs = s.load_transcript_messages(SID)
        last = s.last_seq(SID)
    path = log_file(root)
    damaged = path.read_bytes().replace(b'"step 3"', b'"step@3"', 1)
    path.write_bytes(damaged)
    repair(root)
    assert files_holding(session_dir(root), damaged), "the damaged original was not kept"
    with SessionStore(root) as s:
        assert s.load_bootstrap_state(SID) == want_state
        assert s.load_transcript_messages(SID) == want_msgs
        assert s.last_seq(SID) == last
        s.append_progress_entry(SID, make_entry(77))
        assert s.last_seq(SID) == last + 1
        assert s.verify(SID).ok


def test_item9_repair_never_reuses_a_sequence_number(tmp_path: Path) -> None:
    """Even where nothing can be rebuilt (the archive is gone too), the next event gets a
    sequence number after every one the session ever used."""
    root = tmp_path / "store"
    with seeded(root) as s:
        s.compact(SID, force=True)
        last = s.last_seq(SID)
    shutil.rmtree(session_dir(root) / "archive")
    path = log_file(root)
    path.write_bytes(path.read_bytes().replace(b'"step 3"', b'"step@3"', 1))
    repair(root)
    with SessionStore(root) as s:
        s.append_progress_entry(SID, make_entry(77))
        assert s.last_seq(SID) > last


# -- item 10: an fsync failure --------------------------------------------------------


@contextlib.contextmanager
def failing_once(names: tuple[str, ...], err: int) -> Iterator[list[str]]:
    """Make the first call to any of `os.<names>` made from eventstore fail with `err`."""
    real = {n: getattr(os, n) for n in names if hasattr(os, n)}
    fired: list[str] = []

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*a: Any, **kw: Any) -> Any:
            mod = sys._getframe(1).f_globals.get("__name__", "")
            if not fired and mod.startswith(("eventstore", "projections")):
                fired.append(name)
                raise OSError(err, os.strerror(err))
            return fn(*a, **kw)

        return call

    for n, fn in real.items():
        setattr(os, n, wrap(n, fn))
    try:
        yield fired
    finally:
        for n, fn in real.items():
            setattr(os, n, fn)


def test_item10_an_fsync_failure_cannot_lead_to_a_duplicate_on_retry(tmp_path: Path) -> None:
    root = tmp_path / "store"
    seeded(root).close()
    entry = ProgressEntry(run_id="r", summary="exactly once")
    with SessionStore(root, durability="fsync") as s:
        with (
            failing_once(("fsync", "fdatasync"), errno.EIO) as fired,
            pytest.raises(EventStoreError),
        ):
            s.append_progress_entry(SID, entry)
        assert fired
        s.append_progress_entry(SID, entry)  # the caller retries, as an error invites
    state, _ = fresh_state(root)
    assert [p.summary for p in state.recent_progress].count("exactly once") == 1


# -- item 11: a call that writes nothing creates nothing ---------------------------------


def _created(root: Path) -> list[str]:
    return (
        sorted(str(p.relative_to(root)) for p in (root / "sessions").rglob("*"))
        if (root / "sessions").exists()
        else []
    )


def test_item11_a_refused_first_append_leaves_no_session(tmp_path: Path) -> None:
    root = tmp_path / "store"
    with SessionStore(root) as s:
        with failing_once(("write",), errno.ENOSPC), pytest.raises(EventStoreError):
            s.append_progress_entry("new", make_entry(1))
        assert s.list_sessions() == []
    assert not any(p.name == "log.jsonl" for p in root.rglob("*"))
    with SessionStore(root) as s:
        assert s.list_sessions() == []


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda s: s.compact("never", force=True), id="compact"),
        pytest.param(
            lambda s: s.update_feature_pass("nosess", "f1", True), id="update_feature_pass"
        ),
        pytest.param(lambda s: s.load_bootstrap_state("ghost"), id="load_bootstrap"),
        pytest.param(lambda s: s.load_transcript_messages("ghost"), id="load_transcript"),
        pytest.param(lambda s: s.last_seq("ghost"), id="last_seq"),
        pytest.param(lambda s: s.is_initialized("ghost"), id="is_initialized"),
    ],
)
def test_item11_a_call_on_an_unknown_session_creates_nothing(
    tmp_path: Path, call: Callable[[SessionStore], Any]
) -> None:
    root = tmp_path / "store"
    with SessionStore(root) as s:
        with contextlib.suppress(EventStoreError):
            call(s)
        assert s.list_sessions() == []
    assert _created(root) == []


# -- item 12: every error is an EventStoreError ------------------------------------------

_LONE = "\ud800"


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.append_progress_entry(SID, ProgressEntry(run_id="r", summary=_LONE)),
        lambda s: s.append_transcript_messages(SID, [Message(role=Role.USER, content=_LONE)]),
        lambda s: s.save_manifest(SID, make_manifest(SID, current_objective=_LONE)),
        lambda s: s.append_progress_entry(SID, make_entry(1), idempotency_key=_LONE),
        lambda s: s.update_feature_pass(SID, "f1", True, idempotency_key="k" + _LONE),
        # a label's key reached msgspec's encoder unchecked: its own UnicodeEncodeError
        lambda s: s.set_labels(SID, {"k" + _LONE: "v"}),
        lambda s: s.set_labels(SID, {"k": "v" + _LONE}),
    ],
    ids=[
        "progress",
        "message",
        "manifest",
        "idempotency-key",
        "key-on-update",
        "label-key",
        "label-value",
    ],
)
def test_item12_a_lone_surrogate_is_a_typed_error_and_writes_nothing(
    tmp_path: Path, call: Callable[[SessionStore], Any]
) -> None:
    root = tmp_path / "store"
    seeded(root).close()
    before = log_file(root).read_bytes()
    with SessionStore(root) as s, pytest.raises(InvalidRecordError):
        call(s)
    assert log_file(root).read_bytes() == before


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(["x"], id="list"),
        pytest.param({"x": 1}, id="dict"),
        pytest.param(("x",), id="tuple"),
        pytest.param(b"x", id="bytes"),
    ],
)
@pytest.mark.parametrize(
    "call",
    [
        lambda s, sid: s.load_bootstrap_state(sid),
        lambda s, sid: s.append_progress_entry(sid, make_entry(1)),
        lambda s, sid: s.last_seq(sid),
        lambda s, sid: s.is_initialized(sid),
    ],
    ids=["load", "append", "last_seq", "is_initialized"],
)
def test_item12_a_non_str_session_id_is_invalid_session_id_error(
    tmp_path: Path, bad: Any, call: Callable[[SessionStore, Any], Any]
) -> None:
    with SessionStore(tmp_path / "store") as s, pytest.raises(InvalidSessionIdError):
        call(s, bad)


@contextlib.contextmanager
def unreadable(root: Path) -> Iterator[None]:
    """`root` as a directory without read or search permission looks to a process that is
    not root: stat of the root works, anything that lists it or reaches inside is EACCES.
    (chmod 000 does nothing when the tests run as root, so the os calls are intercepted.)"""
    inside = os.fspath(root)
    names = ("open", "stat", "lstat", "scandir", "listdir", "mkdir", "access")
    real = {n: getattr(os, n) for n in names}

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(path: Any = ".", *a: Any, **kw: Any) -> Any:
            p = os.fspath(path) if isinstance(path, (str, os.PathLike)) else None
            if p is not None and kw.get("dir_fd") is None:
                p = os.path.abspath(p)
                if p.startswith(inside + os.sep) or (
                    p == inside and name in ("scandir", "listdir", "open")
                ):
                    raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), p)
            return fn(path, *a, **kw)

        return call

    for n, fn in real.items():
        setattr(os, n, wrap(n, fn))
    try:
        yield
    finally:
        for n, fn in real.items():
            setattr(os, n, fn)


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda s: s.load_bootstrap_state(SID), id="load_bootstrap"),
        pytest.param(lambda s: s.load_transcript_messages(SID), id="load_transcript"),
        pytest.param(lambda s: s.last_seq(SID), id="last_seq"),
        pytest.param(lambda s: s.list_sessions(), id="list_sessions"),
        pytest.param(lambda s: s.append_progress_entry(SID, make_entry(1)), id="append"),
    ],
)
def test_item12_an_unreadable_root_is_a_typed_error(
    tmp_path: Path, call: Callable[[SessionStore], Any]
) -> None:
    root = tmp_path / "store"
    seeded(root).close()
    s = SessionStore(root)
    try:
        with unreadable(root), pytest.raises(EventStoreError) as info:
            call(s)
        assert str(root) in str(info.value)
    finally:
        s.close()


# -- item 13: archive growth ------------------------------------------------------------


def test_item13_archive_bytes_stay_within_1_2x_the_events_they_hold(tmp_path: Path) -> None:
    """Compacted after every few turns, a session with a growing transcript keeps an
    archive that holds each event once: its bytes stay within 1.2x the bytes of the
    event lines it holds, however many compactions ran."""
    root = tmp_path / "store"
    event_bytes = 0
    with SessionStore(root) as s:
        for turn in range(40):
            s.append_transcript_messages(
                SID, [Message(role=Role.USER, content=f"turn {turn} " + "z" * 3000)]
            )
            if turn % 2 == 1:
                lines = log_file(root).read_bytes().splitlines(keepends=True)
                event_bytes += sum(
                    len(ln) for ln in lines if not ln.startswith(b'{"type":"snapshot"')
                )
                s.compact(SID, force=True)
        assert s.verify(SID).ok
        assert len(s.load_transcript_messages(SID)) == 40
        assert [e.seq for e in s.read_events(SID)] == list(range(1, 41))
    total = sum(p.stat().st_size for p in archive_files(root))
    assert total <= 1.2 * event_bytes, f"archive {total} B for {event_bytes} B of events"


def test_item13_compacting_a_lone_snapshot_is_skipped_with_a_reason(tmp_path: Path) -> None:
    root = tmp_path / "store"
    with seeded(root) as s:
        first = s.compact(SID, force=True)
        assert first.compacted
        n = len(archive_files(root))
        log_before = log_file(root).read_bytes()
        again = s.compact(SID, force=True)
    assert not again.compacted
    assert again.archive_path is None
    assert again.notes and all(isinstance(n_, str) and n_ for n_ in again.notes)
    assert len(archive_files(root)) == n
    assert log_file(root).read_bytes() == log_before


@pytest.mark.parametrize("engine", ["file", "memory"])
def test_item13_every_engine_archives_each_event_once(tmp_path: Path, engine: str) -> None:
    """On every engine, after repeated compactions the history holds each event once and
    only the live snapshot: no archived copy of an older snapshot's state."""
    url = str(tmp_path / "store") if engine == "file" else "memory://"
    with SessionStore(url) as s:
        for turn in range(9):
            s.append_transcript_messages(SID, [Message(role=Role.USER, content=f"t{turn}")])
            if turn % 3 == 2:
                s.compact(SID, force=True)
        s.append_progress_entry(SID, make_entry(1))
        assert [e.seq for e in s.read_events(SID)] == list(range(1, 11))
        assert [e.seq for e in s.read_events(SID, types=["snapshot"])] == [9]
        assert s.verify(SID).ok
        assert len(s.load_transcript_messages(SID)) == 9


# -- attacks: what a load returns is the caller's own -------------------------------------


def _rich(i: int) -> list[Message]:
    return [
        Message(Role.USER, f"plain {i}"),
        Message(
            Role.ASSISTANT,
            f"rich {i}",
            blocks=[ToolUseBlock(id=f"t{i}", name="Bash", input={"argv": ["ls", str(i)]})],
            metadata={"trace": {"depth": [i]}},
        ),
    ]


def _vandalize(value: Any) -> None:
    """Change everything a caller can change in what a load returned."""
    if isinstance(value, list):
        for item in value:
            _vandalize(item)
        value.append(Message(Role.SYSTEM, "planted"))
    elif isinstance(value, dict):
        for item in list(value.values()):
            _vandalize(item)
        value["planted"] = ["x"]
    elif isinstance(value, Message):
        _vandalize(value.blocks)
        _vandalize(value.metadata)
        for b in value.blocks:
            if isinstance(b, ToolUseBlock):
                _vandalize(b.input)
    elif isinstance(value, BootstrapState):
        if value.manifest is not None:
            _vandalize(value.manifest.metadata)
            if value.manifest.init_plan is not None:
                value.manifest.init_plan.steps.clear()
        for f in value.feature_list:
            f.steps.append("planted")
            f.passes = not f.passes
        value.feature_list.reverse()
        value.recent_progress.clear()
        value.checkpoints.clear()
    elif isinstance(value, MessagesAppended):
        _vandalize(value.messages)
    elif isinstance(value, (ManifestSet, FeatureListReplaced)):
        _vandalize(value.manifest.metadata if isinstance(value, ManifestSet) else value.features)


@pytest.mark.usefixtures("no_transcript_cache")
@pytest.mark.parametrize("compacted", [False, True])
def test_nothing_any_load_returns_changes_the_store_when_changed(url: str, compacted: bool) -> None:
    with SessionStore(url) as s:
        s.initialize_session_if_missing(SID, make_manifest(SID), make_features(3))
        for i in range(6):
            s.append_transcript_messages(SID, _rich(i))
            s.append_progress_entry(SID, make_entry(i))
        if compacted:
            assert s.compact(SID, force=True).compacted
            s.append_transcript_messages(SID, _rich(6))
        truth = (
            s.load_transcript_messages(SID),
            s.load_bootstrap_state(SID),
            list(s.read_events(SID)),
            s.load(SID, "idempotency"),
        )
    for warm in (False, True):
        with SessionStore(url) as s:
            if warm:
                s.load_transcript_messages(SID)
                s.load_bootstrap_state(SID)
            last = s.last_seq(SID)
            for got in (
                s.load_transcript_messages(SID, last=3),
                s.load_transcript_messages(SID, last=100),
                s.load_transcript_messages(SID, start=1, limit=2),
                s.load_transcript_messages(SID, start=5),
                s.load_transcript_messages(SID),
                s.load(SID, "transcript"),
                s.load(SID, "bootstrap"),
                s.load(SID, "idempotency"),
                s.load_bootstrap_state(SID),
                s.transcript_at(SID, seq=last),
                s.state_at(SID, seq=last),
                list(s.read_events(SID)),
            ):
                _vandalize(got)
            assert s.load_transcript_messages(SID) == truth[0]
            assert s.load_transcript_messages(SID, last=4) == truth[0][-4:]
            assert s.load_bootstrap_state(SID) == truth[1]
            assert list(s.read_events(SID)) == truth[2]
            assert s.load(SID, "idempotency") == truth[3]
            assert s.transcript_at(SID, seq=last) == truth[0]
        with SessionStore(url) as s:  # and nothing of it reached a cache
            assert s.load_transcript_messages(SID) == truth[0]
            assert s.load_bootstrap_state(SID) == truth[1]


# -- attacks -------------------------------------------------------------------------------


def test_changing_loaded_plain_messages_changes_no_other_message(root: Path) -> None:
    """The private copies of plain messages share one empty `blocks` list and one empty
    `metadata` dict (`codec._NO_BLOCKS`): a caller changing the messages a load gives it,
    by every way of loading, changes neither the store's state, nor the next load, nor
    the cache a cold load reads, nor the shared containers."""
    with SessionStore(root) as s:  # the creator: it keeps the transcript as it appends
        for i in range(3):
            s.append_transcript_messages(
                SID, [Message(Role.USER, f"p{i}"), Message(Role.ASSISTANT, f"a{i}")]
            )
        for page in every_transcript_load(s, SID):
            for m in page:
                m.blocks.append(TextBlock("meddled"))
                m.metadata["meddled"] = True
        # the shared containers are still empty: the next plain message copied holds them
        _, (stamped,), _ = EventCodec().encode_batch(
            [MessagesAppended(messages=[Message(Role.USER, "next")])], 1, "", TS, None, check=True
        )
        shared = stamped.messages[0]  # type: ignore[attr-defined]
        assert shared.blocks == [] and shared.metadata == {}
        again = s.load_transcript_messages(SID)
        assert all(not m.blocks and not m.metadata for m in again)
        assert [m.content for m in again] == ["p0", "a0", "p1", "a1", "p2", "a2"]
    with SessionStore(root) as cold:
        read = cold.load_transcript_messages(SID)
    assert read == again
    assert b"meddled" not in log_path(root, SID).read_bytes()


def _rich_message(i: int) -> Message:
    return Message(
        Role.ASSISTANT,
        f"turn {i}",
        blocks=[TextBlock(f"turn {i}"), ToolUseBlock("t", "run", {"argv": ["ls"], "n": i})],
        metadata={"tags": [i]},
    )


@pytest.mark.usefixtures("fast_switches")
def test_threads_changing_what_they_loaded_never_change_the_store_or_each_other(
    tmp_path: Path,
) -> None:
    """Threads load (bootstrap, whole transcript, warm pages) and change everything
    mutable in what they got — manifest metadata and init plan, feature steps and
    flags, message blocks, tool-call inputs and metadata — while another appends;
    a fresh store and every later load agree with the log."""
    sid = "s"
    manifest = SessionManifest(sid, "main", "obj", metadata={"k": "v"})
    features = [FeatureRecord(f"f{i}", "c", "d", ["a"], False) for i in range(5)]
    store = SessionStore(tmp_path)
    try:
        store.initialize_session_if_missing(sid, manifest, features)
        store.append_transcript_messages(sid, [_rich_message(i) for i in range(20)])

        def vandal() -> None:
            for _ in range(100):
                st = store.load_bootstrap_state(sid)
                assert st.manifest is not None
                st.manifest.metadata["k"] = "changed"
                st.feature_list[0].steps.append("x")
                st.feature_list[0].passes = True
                st.feature_list.reverse()
                st.recent_progress.clear()
                for page in every_transcript_load(store, sid):
                    for m in page:
                        m.blocks.append(TextBlock("x"))
                        m.tool_calls[0].input["argv"].append("-l")
                        m.metadata["tags"].append(-1)

        def writer() -> None:
            for i in range(20, 60):
                store.append_transcript_messages(sid, [_rich_message(i)])
                store.append_progress_entry(sid, ProgressEntry("r", f"p{i}"))

        assert not run_threads([vandal, vandal, writer])
        with SessionStore(tmp_path) as fresh:
            assert store.load_bootstrap_state(sid) == fresh.load_bootstrap_state(sid)
            assert store.load_transcript_messages(sid) == fresh.load_transcript_messages(sid)
        assert store.load_transcript_messages(sid) == [_rich_message(i) for i in range(60)]
        st = store.load_bootstrap_state(sid)
        assert st.manifest == manifest and st.feature_list == features
    finally:
        store.close()
