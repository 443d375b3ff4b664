"""The harness session map (eventstore.harness_sessions) and `eventstore contexts`."""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing
import os
import re
import stat
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from conftest import cli_in_process, one_line_error, run_threads
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import eventstore.harness_sessions as hs
from eventstore import EventStoreError, SessionStore
from eventstore.cli import contexts as cli_contexts
from eventstore.harness_sessions import (
    FORGET_BY_A2A,
    FORGET_BY_CLI,
    HARNESS_SESSION_FILE_NAME,
    HARNESS_SESSION_TYPE,
    HISTORY_SESSION_ID,
    HISTORY_STORE_DIR,
    HarnessSessionMap,
    current_bindings,
    history_in,
    is_plain_context_id,
    new_harness_session_id,
    read_history,
)

ENTRY_RE = re.compile(
    r'\{"type":"murmur\.harness-session","session_id":"(?P<sid>[^"]*)",'
    r'"harness":"(?P<harness>[^"]*)","driver":"(?P<driver>[^"]*)",'
    r'"created_ms":(?P<created>\d+),"updated_ms":(?P<updated>\d+)\}\Z'
)
UUID7_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}\Z")
BAD_IDS = [
    "../escape",
    ".hidden",
    "a/b",
    "",
    ".",
    "..",
    "a\\b",
    "nul\x00byte",
    "/abs",
    "x" * 256,
    "é" * 128,  # 256 bytes of UTF-8
    "lone\ud800surrogate",
]


@pytest.fixture
def base(tmp_path: Path) -> Path:
    return tmp_path


@pytest.fixture
def map_root(tmp_path: Path) -> Path:
    return tmp_path / "contexts"


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path / "work"


@pytest.fixture
def hmap(map_root: Path, workdir: Path) -> Iterator[HarnessSessionMap]:
    with HarnessSessionMap(map_root, workdir) as m:
        yield m


def report_lines(workdir: Path) -> list[str]:
    log = workdir / "logs" / "bootstrap.log"
    if not log.exists():
        return []
    return log.read_text(encoding="utf-8").splitlines()


def all_paths(top: Path) -> set[Path]:
    out = set()
    for dirpath, dirnames, filenames in os.walk(top):
        for n in dirnames + filenames:
            out.add(Path(dirpath) / n)
    return out


def write_raw(map_root: Path, context_id: str, data: bytes | str) -> Path:
    d = map_root / context_id
    d.mkdir(parents=True, exist_ok=True)
    p = d / HARNESS_SESSION_FILE_NAME
    p.write_bytes(data.encode() if isinstance(data, str) else data)
    return p


# -- ids and constants ---------------------------------------------------------------


def test_constants() -> None:
    assert HARNESS_SESSION_FILE_NAME == "harness-session.json"
    assert HARNESS_SESSION_TYPE == "murmur.harness-session"
    assert FORGET_BY_CLI == "cli"
    assert FORGET_BY_A2A == "a2a"


def test_importable_from_the_package() -> None:
    import eventstore

    if not hasattr(eventstore, "HarnessSessionMap"):
        pytest.skip("eventstore/__init__.py does not export the map yet (wired separately)")
    for name in (
        "HarnessSessionMap",
        "new_harness_session_id",
        "HARNESS_SESSION_FILE_NAME",
        "HARNESS_SESSION_TYPE",
        "FORGET_BY_CLI",
        "FORGET_BY_A2A",
    ):
        assert getattr(eventstore, name) is getattr(hs, name), name


def test_new_harness_session_id_is_uuid7() -> None:
    before = time.time_ns() // 1_000_000
    sid = new_harness_session_id()
    after = time.time_ns() // 1_000_000
    assert len(sid) == 36 and UUID7_RE.match(sid), sid
    u = uuid.UUID(sid)
    assert u.version == 7 and u.variant == uuid.RFC_4122
    assert str(u) == sid
    ms = u.int >> 80
    assert before <= ms <= after + 1


def test_new_harness_session_id_unique_and_ordered_within_a_millisecond() -> None:
    ids = [new_harness_session_id() for _ in range(20_000)]
    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)  # lexical order of the hex form is time order
    ms = [uuid.UUID(i).int >> 80 for i in ids]
    assert len(set(ms)) < len(ids)  # many shared a millisecond, and still differ
    assert all(UUID7_RE.match(i) for i in ids)


def test_new_harness_session_id_monotonic_when_clock_steps_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = iter([5_000_000_000_000, 4_000_000_000_000, 4_000_000_000_000])
    monkeypatch.setattr(hs, "now_ms", lambda: next(clock))
    a, b, c = (new_harness_session_id() for _ in range(3))
    assert a < b < c
    assert uuid.UUID(b).int >> 80 == 5_000_000_000_000  # did not go back in time


def _child_ids(q: multiprocessing.Queue[list[str]]) -> None:
    q.put([new_harness_session_id() for _ in range(500)])


def test_new_harness_session_id_differs_in_a_forked_child() -> None:
    mine = [new_harness_session_id() for _ in range(10)]
    ctx = multiprocessing.get_context("fork")
    q: multiprocessing.Queue[list[str]] = ctx.Queue()
    p = ctx.Process(target=_child_ids, args=(q,))
    p.start()
    theirs = q.get(timeout=20)
    p.join(20)
    more = [new_harness_session_id() for _ in range(500)]
    assert not set(theirs) & set(more + mine)


# -- paths ---------------------------------------------------------------------------


def test_entry_path(map_root: Path, workdir: Path) -> None:
    m = HarnessSessionMap(map_root, workdir)
    assert m.root == map_root
    assert m.entry_path("ctx-1") == map_root / "ctx-1" / "harness-session.json"
    assert m.entry_path("a b é") == map_root / "a b é" / "harness-session.json"
    assert m.entry_path("x" * 255) is not None
    assert HarnessSessionMap(None, workdir).entry_path("ctx-1") is None
    assert HarnessSessionMap(None, workdir).root is None


@pytest.mark.parametrize("bad", BAD_IDS, ids=repr)
def test_non_plain_context_ids_get_no_file(bad: str, base: Path, map_root: Path) -> None:
    map_root.mkdir()
    workdir = base / "work"
    before = all_paths(base)
    m = HarnessSessionMap(map_root, workdir)
    assert m.entry_path(bad) is None
    assert not is_plain_context_id(bad)
    m.put(bad, "sid-1", "h", "d")
    assert m.get(bad) == "sid-1"  # remembered in memory
    assert all_paths(base) == before  # no file, no history, nothing outside the root
    assert m.forget(bad, by=FORGET_BY_CLI) == "sid-1"
    assert m.get(bad) is None
    assert all_paths(base) == before
    assert not (base / "escape").exists()


@pytest.mark.slow
@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(context_id=st.text(min_size=0, max_size=300))
def test_any_context_id_stays_inside_the_root(context_id: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        map_root = base / "root"
        m = HarnessSessionMap(map_root, base / "work")
        path = m.entry_path(context_id)
        if path is not None:
            assert path.parent.parent == map_root
            assert path.parent.name == context_id
            assert os.path.realpath(path).startswith(os.path.realpath(map_root) + os.sep)
        m.put(context_id, "sid", "h", "d")
        assert m.get(context_id) == "sid"
        assert HarnessSessionMap(map_root, base / "work").get(context_id) == (
            "sid" if path is not None else None
        )
        # nothing but the root was created, nothing was reported
        assert {p.name for p in base.iterdir()} <= {"root"}
        for p in all_paths(map_root):
            assert os.path.realpath(p).startswith(os.path.realpath(map_root) + os.sep)
        m.close()


# -- put and get ---------------------------------------------------------------------


def test_put_writes_the_exact_file(hmap: HarnessSessionMap, map_root: Path) -> None:
    sid = new_harness_session_id()
    hmap.put("ctx-1", sid, "claude-code", "acp")
    assert hmap.get("ctx-1") == sid
    raw = (map_root / "ctx-1" / "harness-session.json").read_text(encoding="utf-8")
    m = ENTRY_RE.match(raw)
    assert m, raw
    assert (m["sid"], m["harness"], m["driver"]) == (sid, "claude-code", "acp")
    assert m["created"] == m["updated"]
    assert abs(int(m["created"]) - time.time() * 1000) < 60_000
    assert list(json.loads(raw)) == [
        "type",
        "session_id",
        "harness",
        "driver",
        "created_ms",
        "updated_ms",
    ]
    # no temporary file is left behind
    assert os.listdir(map_root / "ctx-1") == ["harness-session.json"]


def test_second_instance_reads_what_the_first_wrote(map_root: Path, workdir: Path) -> None:
    a = HarnessSessionMap(map_root, workdir)
    a.put("ctx-1", "sid-1", "h", "d")
    a.put("ctx-2", "sid-2", "h", "d")
    b = HarnessSessionMap(map_root, workdir)
    assert b.get("ctx-1") == "sid-1"
    assert b.get("ctx-2") == "sid-2"
    assert b.get("ctx-3") is None


def test_modes_of_file_and_three_directory_levels(base: Path, workdir: Path) -> None:
    old = os.umask(0)  # a permissive umask: the modes must come from creation, not umask
    try:
        map_root = base / "level1" / "level2"
        m = HarnessSessionMap(map_root, workdir)
        m.put("level3", "sid", "h", "d")
        m.close()
    finally:
        os.umask(old)
    for d in (base / "level1", map_root, map_root / "level3"):
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o700, d
    f = map_root / "level3" / HARNESS_SESSION_FILE_NAME
    assert stat.S_IMODE(os.stat(f).st_mode) == 0o600
    # the history's files are private too
    for p in all_paths(map_root / HISTORY_STORE_DIR):
        want = 0o700 if p.is_dir() else 0o600
        assert stat.S_IMODE(os.stat(p).st_mode) == want, p


def test_created_ms_survives_rewrites(
    hmap: HarnessSessionMap, map_root: Path, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [1_000]
    monkeypatch.setattr(hs, "now_ms", lambda: now[0])
    hmap.put("ctx", "sid-1", "h", "d")
    now[0] = 2_000
    hmap.put("ctx", "sid-2", "h2", "d2")
    entry = json.loads((map_root / "ctx" / HARNESS_SESSION_FILE_NAME).read_text())
    assert (entry["created_ms"], entry["updated_ms"], entry["session_id"]) == (
        1_000,
        2_000,
        "sid-2",
    )
    now[0] = 3_000
    other = HarnessSessionMap(map_root, workdir)  # a fresh process keeps it too
    other.put("ctx", "sid-3", "h", "d")
    entry = json.loads((map_root / "ctx" / HARNESS_SESSION_FILE_NAME).read_text())
    assert (entry["created_ms"], entry["updated_ms"]) == (1_000, 3_000)


def test_a_later_write_by_another_process_wins(
    hmap: HarnessSessionMap, map_root: Path, workdir: Path
) -> None:
    """The newest write wins across processes (issue 12 item 14): a put or forget made
    elsewhere after this process's put is what `get` returns here."""
    hmap.put("ctx", "mine", "h", "d")
    write_raw(
        map_root,
        "ctx",
        '{"type":"murmur.harness-session","session_id":"theirs","harness":"h","driver":"d",'
        '"created_ms":1,"updated_ms":2}',
    )  # the other runtime, whatever its clock says
    assert hmap.get("ctx") == "theirs"
    other = HarnessSessionMap(map_root, workdir)
    other.put("ctx", "other", "h", "d")
    assert hmap.get("ctx") == "other"
    assert other.forget("ctx", by=FORGET_BY_CLI) == "other"
    assert hmap.get("ctx") is None
    assert hmap.forget("ctx", by=FORGET_BY_CLI) is None


def test_a_put_that_could_not_be_written_yields_only_to_a_later_file(
    hmap: HarnessSessionMap, map_root: Path, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What this process could not write stays in its memory and beats an older file;
    a file written after it (a later `updated_ms`) takes over."""
    now = [10_000]
    monkeypatch.setattr(hs, "now_ms", lambda: now[0])
    write_raw(
        map_root,
        "ctx",
        '{"type":"murmur.harness-session","session_id":"old","harness":"h","driver":"d",'
        '"created_ms":1,"updated_ms":9000}',
    )

    def refuse(root: Path, context_id: str, data: bytes, *, replace: bool) -> bool:
        raise PermissionError(13, "Permission denied", str(root / context_id))

    monkeypatch.setattr(HarnessSessionMap, "_write_entry", staticmethod(refuse))
    hmap.put("ctx", "unwritten", "h", "d")
    assert hmap.get("ctx") == "unwritten"
    assert HarnessSessionMap(map_root, workdir).get("ctx") == "old"  # others see the file
    write_raw(
        map_root,
        "ctx",
        '{"type":"murmur.harness-session","session_id":"later","harness":"h","driver":"d",'
        '"created_ms":1,"updated_ms":10001}',
    )
    assert hmap.get("ctx") == "later"
    assert len(report_lines(workdir)) == 1


def test_entries_written_elsewhere_are_seen(
    hmap: HarnessSessionMap, map_root: Path, workdir: Path
) -> None:
    assert hmap.get("ctx") is None
    HarnessSessionMap(map_root, workdir).put("ctx", "theirs", "h", "d")
    assert hmap.get("ctx") == "theirs"  # file reads are not cached


def test_empty_session_id_is_ignored(hmap: HarnessSessionMap, map_root: Path) -> None:
    hmap.put("ctx", "", "h", "d")
    assert hmap.get("ctx") is None
    assert not (map_root / "ctx").exists()
    hmap.put("ctx", "sid", "h", "d")
    hmap.put("ctx", "", "h", "d")
    assert hmap.get("ctx") == "sid"
    assert [e.action for e in read_history(map_root)] == ["put"]


def test_put_rejects_non_str_arguments(hmap: HarnessSessionMap) -> None:
    with pytest.raises(TypeError):
        hmap.put("ctx", None, "h", "d")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        hmap.forget("ctx", by=None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"not json",
        b'{"type":"murmur.harness-session","session_id":"sid"',  # half a file
        b"[]",
        b'"murmur.harness-session"',
        b'{"type":"other.type","session_id":"sid","harness":"h","driver":"d"}',
        b'{"session_id":"sid","harness":"h","driver":"d"}',
        b'{"type":"murmur.harness-session","session_id":"","harness":"h","driver":"d"}',
        b'{"type":"murmur.harness-session","harness":"h","driver":"d"}',
        b'{"type":"murmur.harness-session","session_id":42,"harness":"h","driver":"d"}',
        b'{"type":"murmur.harness-session","session_id":"sid","created_ms":"yesterday"}',
        b"\xff\xfe\x00garbage",
    ],
    ids=repr,
)
def test_a_file_that_is_not_an_entry_reads_as_absent(
    content: bytes, map_root: Path, workdir: Path
) -> None:
    write_raw(map_root, "ctx", content)
    m = HarnessSessionMap(map_root, workdir)
    assert m.get("ctx") is None
    assert current_bindings(map_root) == []
    m.put("ctx", "sid", "h", "d")  # and it is simply replaced
    assert HarnessSessionMap(map_root, workdir).get("ctx") == "sid"
    assert report_lines(workdir) == []


def test_odd_things_where_the_file_should_be_read_as_absent(
    map_root: Path, workdir: Path, base: Path
) -> None:
    (map_root / "dir-in-place" / HARNESS_SESSION_FILE_NAME).mkdir(parents=True)
    outside = base / "outside.json"
    outside.write_text('{"type":"murmur.harness-session","session_id":"leak"}')
    (map_root / "symlinked").mkdir()
    (map_root / "symlinked" / HARNESS_SESSION_FILE_NAME).symlink_to(outside)
    os.mkfifo(write_raw(map_root, "fifo", b"").parent / "f")
    (map_root / "fifo" / HARNESS_SESSION_FILE_NAME).unlink()
    os.mkfifo(map_root / "fifo" / HARNESS_SESSION_FILE_NAME)
    m = HarnessSessionMap(map_root, workdir)
    for ctx in ("dir-in-place", "symlinked", "fifo"):
        assert m.get(ctx) is None, ctx
    assert current_bindings(map_root) == []


def test_a_file_from_the_other_runtime_is_read(map_root: Path, workdir: Path) -> None:
    write_raw(
        map_root,
        "ctx",
        '{\n  "updated_ms": 1700000000500,\n  "driver" : "pty",\n'
        '  "created_ms": 1700000000000,\n  "extra": {"nested": [1, 2]},\n'
        '  "session_id": "0190b3c4-0000-7000-8000-000000000001",\n'
        '  "harness": "codex",\n  "type": "murmur.harness-session"\n}\n',
    )
    m = HarnessSessionMap(map_root, workdir)
    assert m.get("ctx") == "0190b3c4-0000-7000-8000-000000000001"
    [b] = current_bindings(map_root)
    assert (b.context_id, b.harness, b.driver, b.created_ms, b.updated_ms) == (
        "ctx",
        "codex",
        "pty",
        1700000000000,
        1700000000500,
    )
    m.put("ctx", "new", "codex", "pty")  # our rewrite keeps its created_ms
    assert (
        json.loads((map_root / "ctx" / HARNESS_SESSION_FILE_NAME).read_text())["created_ms"]
        == 1700000000000
    )


@pytest.mark.parametrize("levels", [300, 5000])
def test_a_file_nesting_deep_is_read_or_absent_never_an_error(
    levels: int, map_root: Path, workdir: Path
) -> None:
    """An entry whose extra field nests deep is read; one whose session id does is
    absent (0.1.0: `get` raised a bare RecursionError from ~1000 levels, the map's
    "never raises" read)."""
    deep = b"[" * levels + b"]" * levels
    entry = b'{"type":"murmur.harness-session","session_id":"sid","harness":"h","driver":"d"'
    write_raw(map_root, "extra", entry + b',"extra":' + deep + b"}")
    write_raw(map_root, "sid", entry.replace(b'"sid"', deep) + b"}")
    m = HarnessSessionMap(map_root, workdir)
    assert (m.get("extra"), m.get("sid")) == ("sid", None)
    assert [b.context_id for b in current_bindings(map_root)] == ["extra"]
    assert report_lines(workdir) == []


# -- forget --------------------------------------------------------------------------


def test_forget_returns_what_it_dropped_and_removes_the_file(
    hmap: HarnessSessionMap, map_root: Path, workdir: Path
) -> None:
    hmap.put("ctx", "sid", "h", "d")
    assert hmap.forget("ctx", by=FORGET_BY_A2A) == "sid"
    assert hmap.get("ctx") is None
    assert not (map_root / "ctx" / HARNESS_SESSION_FILE_NAME).exists()
    assert hmap.forget("ctx", by=FORGET_BY_A2A) is None
    # a binding this process never saw is dropped from the file
    HarnessSessionMap(map_root, workdir).put("ctx2", "theirs", "h", "d")
    assert hmap.forget("ctx2", by=FORGET_BY_CLI) == "theirs"
    assert HarnessSessionMap(map_root, workdir).get("ctx2") is None
    assert report_lines(workdir) == []


def test_forget_whose_file_cannot_be_removed_is_reported(
    hmap: HarnessSessionMap, map_root: Path, workdir: Path
) -> None:
    hmap.put("ctx", "sid", "h", "d")
    f = map_root / "ctx" / HARNESS_SESSION_FILE_NAME
    f.unlink()
    f.mkdir()  # unlink() of a directory fails (EISDIR), even for root
    (f / "keep").write_text("x")
    # the file is the truth: a directory in its place is no binding, but still cannot
    # be removed
    assert hmap.forget("ctx", by=FORGET_BY_CLI) is None
    assert hmap.get("ctx") is None
    for _ in range(5):
        hmap.forget("ctx", by=FORGET_BY_CLI)
    [line] = report_lines(workdir)
    assert line.startswith("[harness-session] ")
    assert "cannot remove" in line and str(f) in line


def test_a_failed_forget_is_not_undone_by_the_stale_file(
    hmap: HarnessSessionMap, map_root: Path, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hmap.put("ctx", "sid", "h", "d")

    def refuse(root: Path, context_id: str) -> None:
        raise PermissionError(1, "Operation not permitted", str(root / context_id))

    monkeypatch.setattr(HarnessSessionMap, "_remove_entry", staticmethod(refuse))
    assert hmap.forget("ctx", by=FORGET_BY_CLI) == "sid"
    assert (map_root / "ctx" / HARNESS_SESSION_FILE_NAME).exists()
    assert hmap.get("ctx") is None  # this process saw the forget: it wins over the file
    assert hmap.forget("ctx", by=FORGET_BY_CLI) is None
    assert HarnessSessionMap(map_root, workdir).get("ctx") == "sid"  # others see the file
    monkeypatch.undo()
    hmap.put("ctx", "again", "h", "d")
    assert hmap.get("ctx") == "again"
    assert len(report_lines(workdir)) == 1


# -- never fatal ---------------------------------------------------------------------


def test_no_root_is_memory_only(base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(base)
    workdir = base / "work"
    m = HarnessSessionMap(None, workdir)
    for i in range(5):
        m.put(f"ctx-{i}", f"sid-{i}", "h", "d")
    assert [m.get(f"ctx-{i}") for i in range(5)] == [f"sid-{i}" for i in range(5)]
    assert m.forget("ctx-0", by=FORGET_BY_CLI) == "sid-0"
    assert m.get("ctx-0") is None
    assert HarnessSessionMap(None, workdir).get("ctx-1") is None
    assert list(base.iterdir()) == []  # not even the workdir's log


def test_a_map_needs_neither_root_nor_workdir(base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`HarnessSessionMap(None)` (and `HarnessSessionMap()`) is the in-memory map."""
    monkeypatch.chdir(base)
    for m in (HarnessSessionMap(None), HarnessSessionMap()):
        assert m.root is None and m.workdir is None
        m.put("ctx", "sid", "h", "d")
        assert m.get("ctx") == "sid"
        assert m.forget("ctx", by=FORGET_BY_A2A) == "sid"
        assert m.get("ctx") is None
    assert list(base.iterdir()) == []


def test_without_a_workdir_the_failure_goes_to_the_logger_once(
    base: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (base / "file").write_text("x")
    m = HarnessSessionMap(base / "file")
    with caplog.at_level("WARNING", logger="eventstore"):
        for i in range(3):
            m.put(f"ctx-{i}", "sid", "h", "d")
    lines = [r.getMessage() for r in caplog.records if r.name == "eventstore"]
    assert len(lines) == 1 and lines[0].startswith("[harness-session] ")
    assert m.get("ctx-0") == "sid"
    assert not (base / "logs").exists()


def test_root_that_is_a_file_reports_one_line(base: Path) -> None:
    map_root = base / "contexts"
    map_root.write_text("not a directory")
    workdir = base / "work"
    m = HarnessSessionMap(map_root, workdir)
    for i in range(20):
        m.put(f"ctx-{i}", f"sid-{i}", "h", "d")
    assert m.get("ctx-3") == "sid-3"
    assert m.forget("ctx-3", by=FORGET_BY_A2A) == "sid-3"
    assert m.forget("never", by=FORGET_BY_A2A) is None
    assert m.get("ctx-3") is None and m.get("ctx-4") == "sid-4"
    # a second instance with the same workdir in the same process: still one line
    m2 = HarnessSessionMap(map_root, workdir)
    m2.put("ctx-x", "sid-x", "h", "d")
    assert m2.get("ctx-x") == "sid-x"
    lines = report_lines(workdir)
    assert len(lines) == 1, lines
    assert lines[0].startswith("[harness-session] ")
    assert str(map_root) in lines[0]
    assert stat.S_IMODE(os.stat(workdir / "logs").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(workdir / "logs" / "bootstrap.log").st_mode) == 0o600
    assert map_root.read_text() == "not a directory"


def test_root_under_a_file_reports_one_line_per_workdir(base: Path) -> None:
    (base / "file").write_text("x")
    for name in ("work-a", "work-b"):
        workdir = base / name
        (workdir / "logs").mkdir(parents=True)
        (workdir / "logs" / "bootstrap.log").write_text("[bootstrap] earlier line\n")
        m = HarnessSessionMap(base / "file" / "contexts", workdir)
        for i in range(10):
            m.put("ctx", f"sid-{i}", "h", "d")
            m.forget("ctx", by=FORGET_BY_CLI)
        lines = report_lines(workdir)
        assert lines[0] == "[bootstrap] earlier line"  # appended, not overwritten
        assert len(lines) == 2 and lines[1].startswith("[harness-session] ")


@pytest.mark.skipif(
    hasattr(os, "geteuid") and os.geteuid() == 0,
    reason="running as root: a mode 0500 directory does not stop root's writes; the"
    " unwritable-root cases above use a file where a directory should be instead",
)
def test_read_only_root_reports_one_line(map_root: Path, workdir: Path) -> None:
    map_root.mkdir(mode=0o500)
    try:
        m = HarnessSessionMap(map_root, workdir)
        for i in range(5):
            m.put(f"ctx-{i}", "sid", "h", "d")
        assert m.get("ctx-0") == "sid"
        assert len(report_lines(workdir)) == 1
    finally:
        map_root.chmod(0o700)


def test_an_unwritable_workdir_is_survived(base: Path) -> None:
    (base / "root-file").write_text("x")
    (base / "work-file").write_text("x")
    m = HarnessSessionMap(base / "root-file", base / "work-file")
    m.put("ctx", "sid", "h", "d")  # neither the entry nor the report can be written
    assert m.get("ctx") == "sid"


def test_a_symlinked_context_dir_is_not_followed(
    hmap: HarnessSessionMap, map_root: Path, base: Path, workdir: Path
) -> None:
    outside = base / "outside"
    outside.mkdir()
    map_root.mkdir()
    (map_root / "ctx").symlink_to(outside)
    hmap.put("ctx", "sid", "h", "d")
    assert list(outside.iterdir()) == []
    assert hmap.get("ctx") == "sid"
    [line] = report_lines(workdir)
    assert "symlink" in line


def test_get_never_reads_through_a_symlinked_context_dir(
    map_root: Path, base: Path, workdir: Path
) -> None:
    """A context directory planted as a link to a directory holding a valid entry reads
    as absent for `get`, as for `current_bindings`, and `forget` removes nothing there
    (issue 12 item 14)."""
    outside = base / "outside"
    outside.mkdir()
    planted = outside / HARNESS_SESSION_FILE_NAME
    planted.write_text('{"type":"murmur.harness-session","session_id":"planted"}')
    map_root.mkdir()
    (map_root / "ctx").symlink_to(outside)
    m = HarnessSessionMap(map_root, workdir)
    assert m.get("ctx") is None
    assert current_bindings(map_root) == []
    assert m.forget("ctx", by=FORGET_BY_CLI) is None
    assert planted.read_text() == '{"type":"murmur.harness-session","session_id":"planted"}'
    m.put("ctx", "mine", "h", "d")  # refused on disk, kept in memory
    assert json.loads(planted.read_text())["session_id"] == "planted"
    assert m.get("ctx") == "mine"
    assert HarnessSessionMap(map_root, workdir).get("ctx") is None


def _put_many(map_root: str, workdir: str, worker: int, n: int) -> None:
    m = HarnessSessionMap(Path(map_root), Path(workdir))
    for i in range(n):
        m.put("shared", f"w{worker}-{i}", f"harness-{worker}", "d")
    m.close()


def test_concurrent_puts_from_four_processes(map_root: Path, workdir: Path) -> None:
    n = 40
    HarnessSessionMap(map_root, workdir).put("shared", "seed", "h", "d")
    created = json.loads((map_root / "shared" / HARNESS_SESSION_FILE_NAME).read_text())[
        "created_ms"
    ]
    ctx = multiprocessing.get_context("fork")
    procs = [
        ctx.Process(target=_put_many, args=(str(map_root), str(workdir), w, n)) for w in range(4)
    ]
    for p in procs:
        p.start()
    f = map_root / "shared" / HARNESS_SESSION_FILE_NAME
    reads = 0
    while any(p.is_alive() for p in procs):  # a reader never sees half a file
        raw = f.read_text(encoding="utf-8")
        assert ENTRY_RE.match(raw), raw
        reads += 1
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    raw = f.read_text(encoding="utf-8")
    m = ENTRY_RE.match(raw)
    assert m, raw
    worker, i = re.fullmatch(r"w(\d)-(\d+)", m["sid"]).groups()  # type: ignore[union-attr]
    assert m["harness"] == f"harness-{worker}" and 0 <= int(i) < n
    assert int(m["created"]) == created
    assert os.listdir(map_root / "shared") == [HARNESS_SESSION_FILE_NAME]  # no temp files
    history = read_history(map_root)
    assert len(history) == 1 + 4 * n
    assert [h.seq for h in history] == list(range(1, 2 + 4 * n))
    assert report_lines(workdir) == []
    assert reads > 0


def _map_worker(map_root: str, workdir: str, conn: Any) -> None:
    """One process's map, driven over a pipe: ("put", ctx, sid), ("forget", ctx),
    ("get", [ctx...]) -> [sid or None...], ("burst", worker, n, [ctx...]), ("exit",)."""
    import random

    m = HarnessSessionMap(Path(map_root), Path(workdir))
    while True:
        cmd = conn.recv()
        if cmd[0] == "put":
            m.put(cmd[1], cmd[2], "h", "d")
            conn.send(None)
        elif cmd[0] == "forget":
            conn.send(m.forget(cmd[1], by=FORGET_BY_CLI))
        elif cmd[0] == "get":
            conn.send([m.get(c) for c in cmd[1]])
        elif cmd[0] == "burst":
            _, worker, n, ctxs = cmd
            rnd = random.Random(worker)
            for i in range(n):
                c = rnd.choice(ctxs)
                if rnd.random() < 0.2:
                    m.forget(c, by=FORGET_BY_CLI)
                else:
                    m.put(c, f"w{worker}-{i}", "h", "d")
            conn.send(None)
        else:
            m.close()
            conn.send(None)
            return


class _Workers:
    def __init__(self, map_root: Path, workdir: Path, n: int) -> None:
        ctx = multiprocessing.get_context("fork")
        self.conns = []
        self.procs = []
        for _ in range(n):
            mine, theirs = ctx.Pipe()
            p = ctx.Process(target=_map_worker, args=(str(map_root), str(workdir), theirs))
            p.start()
            self.conns.append(mine)
            self.procs.append(p)

    def ask(self, w: int, *cmd: Any) -> Any:
        self.conns[w].send(cmd)
        assert self.conns[w].poll(30), f"worker {w} did not answer {cmd}"
        return self.conns[w].recv()

    def close(self) -> None:
        for w, p in enumerate(self.procs):
            if p.is_alive():
                self.conns[w].send(("exit",))
            p.join(10)
            if p.is_alive():
                p.kill()


def test_newest_write_wins_across_four_processes(map_root: Path, workdir: Path) -> None:
    """Four processes take turns putting and forgetting three contexts; after every step
    all four `get` the newest write, whoever made it (issue 12 item 14)."""
    import random

    rnd = random.Random(12)
    ctxs = ["c0", "c1", "c2"]
    model: dict[str, str | None] = dict.fromkeys(ctxs)
    workers = _Workers(map_root, workdir, 4)
    try:
        for step in range(120):
            w, c = rnd.randrange(4), rnd.choice(ctxs)
            if rnd.random() < 0.25:
                assert workers.ask(w, "forget", c) == model[c], step
                model[c] = None
            else:
                workers.ask(w, "put", c, f"sid-{step}")
                model[c] = f"sid-{step}"
            for r in range(4):
                assert workers.ask(r, "get", ctxs) == [model[x] for x in ctxs], (step, r)
    finally:
        workers.close()
    assert {b.context_id: b.session_id for b in current_bindings(map_root)} == {
        c: v for c, v in model.items() if v is not None
    }
    assert report_lines(workdir) == []


def test_four_processes_writing_at_once_agree_afterwards(map_root: Path, workdir: Path) -> None:
    """Four processes put and forget the same contexts at the same time; once they are
    done every one of them, and a fresh map, reads what the files say."""
    ctxs = ["a", "b"]
    workers = _Workers(map_root, workdir, 4)
    try:
        for w in range(4):
            workers.conns[w].send(("burst", w, 60, ctxs))
        for w in range(4):
            assert workers.conns[w].poll(60)
            workers.conns[w].recv()
        want = [HarnessSessionMap(map_root, workdir).get(c) for c in ctxs]
        for w in range(4):
            assert workers.ask(w, "get", ctxs) == want, w
    finally:
        workers.close()
    assert [b.session_id for b in current_bindings(map_root)] == [x for x in want if x]


def test_threads_share_one_map(hmap: HarnessSessionMap) -> None:
    import threading

    def work(t: int) -> None:
        for i in range(20):
            hmap.put(f"ctx-{t}", f"sid-{t}-{i}", "h", "d")

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [hmap.get(f"ctx-{t}") for t in range(4)] == [f"sid-{t}-19" for t in range(4)]


# -- history and bindings ------------------------------------------------------------


def test_history_records_puts_and_forgets(
    map_root: Path, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    start = datetime.now(UTC)
    m = HarnessSessionMap(map_root, workdir)
    m.put("ctx-1", "sid-1", "claude-code", "acp")
    m.put("ctx-1", "sid-2", "claude-code", "pty")
    m.put(".memory-only", "sid-x", "h", "d")  # no file, so no history either
    assert m.forget("ctx-1", by=FORGET_BY_A2A) == "sid-2"
    assert m.forget("ctx-2", by=FORGET_BY_CLI) is None
    m.close()
    m2 = HarnessSessionMap(map_root, workdir)  # a later process continues the same log
    m2.put("ctx-2", "sid-3", "codex", "acp")
    h = read_history(map_root)
    assert [
        (e.seq, e.action, e.context_id, e.session_id, e.harness, e.driver, e.by) for e in h
    ] == [
        (1, "put", "ctx-1", "sid-1", "claude-code", "acp", None),
        (2, "put", "ctx-1", "sid-2", "claude-code", "pty", None),
        (3, "forget", "ctx-1", "sid-2", "claude-code", "pty", "a2a"),
        (4, "forget", "ctx-2", None, None, None, "cli"),
        (5, "put", "ctx-2", "sid-3", "codex", "acp", None),
    ]
    assert all(start <= e.at <= datetime.now(UTC) for e in h)
    assert [e.at for e in h] == sorted(e.at for e in h)
    # it is an ordinary eventstore log: readable with cat/jq, verifiable
    log = map_root / HISTORY_STORE_DIR / "sessions" / HISTORY_SESSION_ID / "log.jsonl"
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert [x["type"] for x in lines] == ["harness_session_put"] * 2 + [
        "harness_session_forgotten"
    ] * 2 + ["harness_session_put"]
    assert lines[2]["by"] == "a2a"
    # the JSON files, not the history, answer get
    assert current_bindings(map_root)[0].session_id == "sid-3"


def test_history_survives_compaction_by_the_map_store(map_root: Path, workdir: Path) -> None:
    m = HarnessSessionMap(map_root, workdir)
    m.put("ctx", "sid-1", "h", "d")
    m.forget("ctx", by=FORGET_BY_CLI)
    with hs._open_history(map_root) as store:
        if not hasattr(store, "compact"):
            pytest.skip("SessionStore.compact is not available")
        store.compact(HISTORY_SESSION_ID, force=True)
    m.put("ctx", "sid-2", "h", "d")
    assert [(e.action, e.session_id) for e in read_history(map_root)] == [
        ("put", "sid-1"),
        ("forget", "sid-1"),
        ("put", "sid-2"),
    ]


@pytest.mark.parametrize("archive", [True, False])
def test_history_survives_compaction_by_a_plain_store(
    map_root: Path, workdir: Path, archive: bool
) -> None:
    # e.g. `eventstore compact ROOT/.eventstore`: a store that knows neither the history's
    # event types nor its projection; it keeps the events verbatim (archive or `unknown`)
    m = HarnessSessionMap(map_root, workdir)
    m.put("ctx", "sid-1", "h", "d")
    m.forget("ctx", by=FORGET_BY_CLI)
    m.close()
    with SessionStore(map_root / HISTORY_STORE_DIR) as plain:
        plain.compact(HISTORY_SESSION_ID, archive=archive, force=True)
    m = HarnessSessionMap(map_root, workdir)
    m.put("ctx", "sid-2", "h", "d")
    assert [(e.seq, e.action, e.session_id, e.by) for e in read_history(map_root)] == [
        (1, "put", "sid-1", None),
        (2, "forget", "sid-1", "cli"),
        (3, "put", "sid-2", None),
    ]
    assert report_lines(workdir) == []


def test_library_custom_projection_after_foreign_compaction(map_root: Path, workdir: Path) -> None:
    m = HarnessSessionMap(map_root, workdir)
    m.put("ctx", "sid-1", "h", "d")
    m.close()
    with SessionStore(map_root / HISTORY_STORE_DIR) as plain:
        plain.compact(HISTORY_SESSION_ID, archive=False, force=True)
    with hs._open_history(map_root) as store:
        entries = store.load(HISTORY_SESSION_ID, hs._HISTORY.name)
    assert [e.session_id for e in entries] == ["sid-1"]


def test_history_failure_is_reported_and_never_fatal(map_root: Path, workdir: Path) -> None:
    map_root.mkdir()
    (map_root / HISTORY_STORE_DIR).write_text("in the way")
    m = HarnessSessionMap(map_root, workdir)
    for i in range(5):
        m.put("ctx", f"sid-{i}", "h", "d")
    m.forget("ctx", by=FORGET_BY_CLI)
    m.put("ctx", "last", "h", "d")
    assert HarnessSessionMap(map_root, workdir).get("ctx") == "last"  # files still written
    [line] = report_lines(workdir)
    assert line.startswith("[harness-session] ") and "history" in line


def test_read_history_and_current_bindings_on_odd_roots(base: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_history(base / "missing")
    with pytest.raises(FileNotFoundError):
        current_bindings(base / "missing")
    (base / "file").write_text("x")
    with pytest.raises(NotADirectoryError):
        current_bindings(base / "file")
    (base / "empty").mkdir()
    assert read_history(base / "empty") == []
    assert current_bindings(base / "empty") == []
    assert os.listdir(base / "empty") == []  # reading created nothing


def test_current_bindings_lists_valid_entries_sorted(map_root: Path, workdir: Path) -> None:
    m = HarnessSessionMap(map_root, workdir)
    m.put("b", "sid-b", "h", "d")
    m.put("a", "sid-a", "h", "d")
    write_raw(map_root, "broken", "{")
    (map_root / "no-entry").mkdir()
    (map_root / "stray-file").write_text("x")
    (map_root / "link").symlink_to(map_root / "a")
    assert [(b.context_id, b.session_id) for b in current_bindings(map_root)] == [
        ("a", "sid-a"),
        ("b", "sid-b"),
    ]


# -- the `contexts` subcommand -------------------------------------------------------


def run_cli(*argv: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="eventstore")
    cli_contexts.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["contexts", *argv])
    out, err = io.StringIO(), io.StringIO()
    code = cli_contexts.run(args, out, err)
    return code, out.getvalue(), err.getvalue()


def test_cli_contexts_table_and_json(map_root: Path, workdir: Path) -> None:
    m = HarnessSessionMap(map_root, workdir)
    sid = new_harness_session_id()
    m.put("ctx-long-name", sid, "claude-code", "acp")
    m.put("c2", "s2", "codex", "pty")
    m.put("tab\there", "s3", "h", "d")
    code, out, err = run_cli(str(map_root))
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].split() == ["CONTEXT", "SESSION", "HARNESS", "DRIVER", "CREATED", "UPDATED"]
    assert len(lines) == 4
    assert lines[1].startswith("c2 ") and "tab\\there" in lines[3]  # control chars escaped
    col = lines[0].index("SESSION")  # aligned columns
    assert all(line[col - 2 : col] == "  " for line in lines)
    assert lines[2][col:].startswith(sid)
    code, out, _ = run_cli(str(map_root), "--json")
    data = json.loads(out)
    assert [d["context_id"] for d in data] == ["c2", "ctx-long-name", "tab\there"]
    assert data[1]["session_id"] == sid and set(data[1]) == {
        "context_id",
        "session_id",
        "harness",
        "driver",
        "created_ms",
        "updated_ms",
    }


def test_cli_contexts_history(map_root: Path, workdir: Path) -> None:
    m = HarnessSessionMap(map_root, workdir)
    m.put("ctx", "sid", "claude-code", "acp")
    m.forget("ctx", by=FORGET_BY_CLI)
    code, out, _ = run_cli(str(map_root), "--history")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == [
        "SEQ",
        "TIME",
        "ACTION",
        "CONTEXT",
        "SESSION",
        "HARNESS",
        "DRIVER",
        "BY",
    ]
    assert lines[1].split()[3:] == ["put", "ctx", "sid", "claude-code", "acp", "-"]
    assert lines[2].split()[3:] == ["forget", "ctx", "sid", "claude-code", "acp", "cli"]
    code, out, _ = run_cli(str(map_root), "--history", "--json")
    data = json.loads(out)
    assert [(d["seq"], d["action"], d["by"]) for d in data] == [
        (1, "put", None),
        (2, "forget", "cli"),
    ]
    assert datetime.fromisoformat(data[0]["at"]).tzinfo is not None


def test_cli_contexts_empty_and_missing_roots(base: Path) -> None:
    (base / "empty").mkdir()
    code, out, _ = run_cli(str(base / "empty"))
    assert code == 0 and "no harness sessions" in out
    code, out, _ = run_cli(str(base / "empty"), "--history")
    assert code == 0 and "no history" in out
    assert run_cli(str(base / "empty"), "--json")[:2] == (0, "[]\n")
    for target, why in ((base / "missing", "no such directory"), (base / "f", "not a directory")):
        if target.name == "f":
            target.write_text("x")
        for extra in ((), ("--history",), ("--json",)):
            code, out, err = run_cli(str(target), *extra)
            assert code == 2 and out == ""
            assert err.count("\n") == 1 and why in err and "Traceback" not in err


def test_cli_contexts_tampered_history_is_a_clear_error(map_root: Path, workdir: Path) -> None:
    m = HarnessSessionMap(map_root, workdir)
    m.put("ctx", "sid", "h", "d")
    m.put("ctx", "sid2", "h", "d")
    m.close()
    log = map_root / HISTORY_STORE_DIR / "sessions" / HISTORY_SESSION_ID / "log.jsonl"
    lines = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(b"garbage\n" + lines[1])
    code, out, err = run_cli(str(map_root), "--history")
    assert code == 1 and out == "" and err.count("\n") == 1 and "error" in err


def test_cli_contexts_takes_root_as_a_file_url_as_every_command_does(
    map_root: Path, workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Attack: `contexts` took ROOT as a directory path only, where every other command
    takes a store URL: `contexts file:///the/map` was "no such directory". A `file://`
    URL of the map's directory now reads it as its path does, bindings and history."""
    with HarnessSessionMap(map_root, workdir) as m:
        m.put("ctx", "sid", "claude-code", "acp")
        m.forget("ctx", by=FORGET_BY_CLI)
        m.put("ctx2", "sid2", "codex", "pty")
    for extra in (["--json"], ["--history", "--json"]):
        by_path = cli_in_process(capsys, "contexts", str(map_root), *extra)
        assert by_path[0] == 0 and json.loads(by_path[1])
        assert cli_in_process(capsys, "contexts", map_root.as_uri(), *extra) == by_path


def test_cli_contexts_reads_the_history_at_a_store_url(
    url: str, map_root: Path, workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Attack: `contexts URL` of a memory, PostgreSQL or Redis store (the map's history
    migrated there) was "no such directory" where every other command opens the URL.
    It now reads the history there as from the map's directory; a store holds no
    bindings (they are files), so without --history it is a one-line refusal; a store
    that is not there is one too, as for `sessions`, and is not made."""
    if "://" not in url:
        pytest.skip("a directory is the map's own root (the test above)")
    with HarnessSessionMap(map_root, workdir) as m:
        m.put("ctx", "sid", "claude-code", "acp")
        m.forget("ctx", by=FORGET_BY_A2A)
    want = cli_in_process(capsys, "contexts", str(map_root), "--history", "--json")
    assert want[0] == 0 and len(json.loads(want[1])) == 2
    # a store with no history (or none at all) answers as `sessions` does: never made
    rc, out, err = cli_in_process(capsys, "contexts", url, "--history")
    assert rc == cli_in_process(capsys, "sessions", url)[0]
    if rc:  # a PostgreSQL schema that is not there
        assert out == "" and "no store" in err
        one_line_error(err)
    else:
        assert out == "no history recorded\n"
    rc, _, _ = cli_in_process(capsys, "migrate", str(map_root / HISTORY_STORE_DIR), url, "--all")
    assert rc == 0
    assert cli_in_process(capsys, "contexts", url, "--history", "--json") == want
    rc, out, err = cli_in_process(capsys, "contexts", url, "--history")
    assert rc == 0 and "forget" in out and "a2a" in out
    rc, out, err = cli_in_process(capsys, "contexts", url)
    assert rc == 2 and out == "" and "--history" in err
    one_line_error(err)


def test_history_in_a_plainly_opened_store_is_the_maps_history(
    url: str, map_root: Path, workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Attack: `history_in(SessionStore(url))` of a store holding the map's history, opened
    without `event_types=HISTORY_EVENT_TYPES`, answered `[]` (every put and forget read
    as an unknown event and passed over): a history that is there, silently empty, on
    every engine. The store learns the history's event types first (as every adapter
    teaches a store it is given), so any store answers what `read_history` does."""
    with HarnessSessionMap(map_root, workdir) as m:
        m.put("ctx", "sid", "claude-code", "acp")
        m.forget("ctx", by=FORGET_BY_CLI)
    want = read_history(map_root)
    assert len(want) == 2
    rc, _, _ = cli_in_process(capsys, "migrate", str(map_root / HISTORY_STORE_DIR), url, "--all")
    assert rc == 0
    with SessionStore(url) as plain:
        assert history_in(plain) == want


def test_cli_contexts_help_has_an_example() -> None:
    parser = argparse.ArgumentParser(prog="eventstore")
    cli_contexts.add_parser(parser.add_subparsers(dest="command"))
    help_text = parser._subparsers._group_actions[0].choices["contexts"].format_help()  # type: ignore[union-attr]
    assert "eventstore contexts" in help_text and "--history" in help_text


# -- bind: exactly one binding wins ---------------------------------------------------


def _bind_at_go(map_root: str, workdir: str, worker: int, go: str, out: str) -> None:
    m = HarnessSessionMap(Path(map_root), Path(workdir))
    while not os.path.exists(go):  # a start gate only: no result depends on timing
        time.sleep(0.0005)
    got = [m.bind(f"ctx-{c}", f"w{worker}-{c}", "h", "d") for c in range(20)]
    Path(out).write_text(json.dumps(got))
    m.close()
    os._exit(0)


def test_processes_binding_the_same_contexts_at_once_all_get_one_binding(
    map_root: Path, workdir: Path, tmp_path: Path
) -> None:
    # get-then-put lets two processes each start a harness under its own new id, one of
    # which nobody looks up again; bind writes a context's file only where none exists
    go = tmp_path / "go"
    ctx = multiprocessing.get_context("fork")
    outs = [tmp_path / f"out-{w}" for w in range(4)]
    procs = [
        ctx.Process(target=_bind_at_go, args=(str(map_root), str(workdir), w, str(go), str(o)))
        for w, o in enumerate(outs)
    ]
    for p in procs:
        p.start()
    go.touch()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    results = [json.loads(o.read_text()) for o in outs]
    fresh = HarnessSessionMap(map_root, workdir)
    on_disk = [fresh.get(f"ctx-{c}") for c in range(20)]
    assert all(r == on_disk for r in results), (results, on_disk)
    assert all(sid is not None and re.fullmatch(r"w\d-\d+", sid) for sid in on_disk)
    history = read_history(map_root)
    assert len(history) == 20  # one binding written per context
    for c in range(20):
        assert os.listdir(map_root / f"ctx-{c}") == [HARNESS_SESSION_FILE_NAME]  # no temps
    assert report_lines(workdir) == []


def test_bind_returns_a_binding_that_exists_and_writes_nothing(
    hmap: HarnessSessionMap, map_root: Path
) -> None:
    assert hmap.bind("ctx", "first", "h", "d") == "first"
    f = map_root / "ctx" / HARNESS_SESSION_FILE_NAME
    before = (f.read_bytes(), f.stat().st_mtime_ns)
    assert hmap.bind("ctx", "second", "h", "d") == "first"
    assert (f.read_bytes(), f.stat().st_mtime_ns) == before
    hmap.put("ctx", "third", "h", "d")  # put still replaces
    assert hmap.bind("ctx", "fourth", "h", "d") == "third"


def test_bind_replaces_an_entry_that_cannot_be_read(
    hmap: HarnessSessionMap, map_root: Path
) -> None:
    write_raw(map_root, "ctx", "not a map entry")
    assert hmap.get("ctx") is None
    assert hmap.bind("ctx", "fresh", "h", "d") == "fresh"
    assert HarnessSessionMap(map_root).get("ctx") == "fresh"


def test_bind_in_memory_only_maps_and_for_ids_that_are_not_plain(
    map_root: Path, workdir: Path
) -> None:
    mem = HarnessSessionMap()
    assert mem.bind("ctx", "a", "h", "d") == "a"
    assert mem.bind("ctx", "b", "h", "d") == "a"
    m = HarnessSessionMap(map_root, workdir)
    assert m.bind("../ctx", "a", "h", "d") == "a"  # kept in memory, never on disk
    assert m.bind("../ctx", "b", "h", "d") == "a"
    assert not (map_root.parent / "ctx").exists()


# -- attacks -------------------------------------------------------------------------------


@pytest.mark.usefixtures("fast_switches")
def test_threads_sharing_one_harness_map_keep_created_ms_and_a_consistent_history(
    tmp_path: Path,
) -> None:
    """Threads put, get and forget on one HarnessSessionMap: every get is a session id
    some put bound, created_ms survives every rewrite, and the history holds every
    put and forget once."""
    from eventstore.harness_sessions import read_history

    hmap = HarnessSessionMap(tmp_path / "map")
    hmap.put("ctx", "first", "h", "d")
    path = hmap.entry_path("ctx")
    assert path is not None
    created = path.read_bytes()
    seen: list[str | None] = []

    def putter(w: int) -> Callable[[], None]:
        def run() -> None:
            for i in range(25):
                hmap.put("ctx", f"w{w}-{i}", "h", "d")

        return run

    def getter() -> None:
        for _ in range(200):
            seen.append(hmap.get("ctx"))

    try:
        assert not run_threads([putter(0), putter(1), getter, getter])
        import json

        entry = json.loads(path.read_bytes())
        assert entry["created_ms"] == json.loads(created)["created_ms"]
        bound = {"first"} | {f"w{w}-{i}" for w in (0, 1) for i in range(25)}
        assert set(seen) <= bound
        assert hmap.forget("ctx", by="cli") in bound
        history = read_history(tmp_path / "map")
        assert [h.action for h in history].count("put") == 51
        assert [h.seq for h in history] == list(range(1, 53))
    finally:
        hmap.close()


# -- attacks -------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["session_id", "harness", "driver"])
def test_map_a_lone_surrogate_is_a_typed_refusal_or_kept(tmp_path: Path, field: str) -> None:
    """Guarantees: every error is an EventStoreError, also for a lone surrogate in any
    string; the map is never fatal. A put with one either stores and reads back, or is
    refused with a typed error and leaves the earlier binding."""
    m = HarnessSessionMap(tmp_path / "root", workdir=tmp_path)
    m.put("ctx", "before", "h", "d")
    args = {"session_id": "after", "harness": "h", "driver": "d", field: "bad\ud800"}
    try:
        m.put("ctx", args["session_id"], args["harness"], args["driver"])
    except Exception as exc:
        assert isinstance(exc, EventStoreError), f"untyped {type(exc).__name__}: {exc}"
        assert m.get("ctx") == "before"
    else:
        assert m.get("ctx") == args["session_id"]


def test_map_an_acknowledged_put_is_never_read_as_absent(tmp_path: Path) -> None:
    """README: a put writes the file and "the newest write wins"; a put that returns
    without an error must be what `get` answers (or it must be refused). A session id
    of 1 MiB is written to disk, then read back as absent (and the old binding is gone)."""
    m = HarnessSessionMap(tmp_path / "root", workdir=tmp_path)
    m.put("ctx", "old", "h", "d")
    big = "s" * (1 << 20)
    try:
        m.put("ctx", big, "h", "d")
    except EventStoreError:
        assert m.get("ctx") == "old"
    else:
        got = m.get("ctx")
        assert got == big, f"put acknowledged, get returned {got if got is None else len(got)}"
        assert HarnessSessionMap(tmp_path / "root").get("ctx") == big
