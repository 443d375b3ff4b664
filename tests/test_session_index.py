"""The session index: `SessionStore.sessions` pages of `SessionInfo`, `set_labels`,
`rebuild_index`, the CLI's paged `sessions`, on every engine; then its attacks (a walk
through pages beside writers, SIGKILL while the file engine updates its index, a
damaged or missing index file, hostile labels).

The index contract of the engines themselves is in the conformance suite
(`test_the_index_follows_appends_installs_repairs_and_removals`,
`test_sessions_pages_agree_with_the_logs`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest
from conftest import cli_in_process, in_forked_child, make_entry
from engines import POSTGRES_URL, EngineCase, fresh_postgres
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventstore import (
    InvalidArgumentError,
    LabelsSet,
    SessionInfo,
    SessionStore,
)
from eventstore.aio import AsyncSessionStore
from eventstore.engines.base import IndexEntry
from eventstore.engines.file import index_lag
from eventstore.engines.file.index import INDEX_NAME, FileIndex

# -- what it promises -------------------------------------------------------------------


def test_a_page_is_newest_written_first_with_what_each_session_holds(url: str) -> None:
    with SessionStore(url) as store:
        for sid in ("a", "b", "c"):
            store.append_progress_entry(sid, make_entry())
        store.append_progress_entry("a", make_entry(1))
        page = store.sessions()
        assert [i.session_id for i in page] == ["a", "c", "b"]
        a = page[0]
        assert isinstance(a, SessionInfo)
        assert (a.last_seq, a.events, a.labels, a.deleted) == (2, 2, {}, False)
        assert a.bytes > 0
        assert a.created < a.updated
        assert [i.session_id for i in store.sessions(order="created")] == ["c", "b", "a"]
        assert [i.session_id for i in store.sessions(order="id")] == ["a", "b", "c"]
        assert store.list_sessions() == ["a", "b", "c"]  # the contract: every id, sorted


def test_labels_are_an_event_listed_filtered_and_kept_through_compaction(url: str) -> None:
    with SessionStore(url) as store:
        store.append_progress_entry("s", make_entry())
        store.set_labels("s", {"team": "red", "tier": "1"})
        store.set_labels("t", {"team": "blue"})
        events = list(store.read_events("s"))
        assert type(events[-1]) is LabelsSet and events[-1].labels == {"team": "red", "tier": "1"}
        assert [i.session_id for i in store.sessions(labels={"team": "red"})] == ["s"]
        assert store.sessions(labels={"team": "red", "tier": "2"}) == []
        store.set_labels("s", {"tier": "2"})  # the whole set: team is gone
        assert store.sessions(labels={"team": "red"}) == []
        store.compact("s", force=True, archive=False)
        assert store.rebuild_index() == 2  # every engine keeps an index
        (s,) = store.sessions("s")
        assert s.labels == {"tier": "2"} and s.last_seq == 3 and s.events == 1


@pytest.mark.parametrize(
    "labels",
    [None, ["a"], {"": "x"}, {"k": 1}, {1: "v"}, {"k": "v" * 2000}],
    ids=["none", "list", "empty-key", "int-value", "int-key", "too-long"],
)
def test_bad_labels_are_refused_and_nothing_is_written(labels: object, url: str) -> None:
    with SessionStore(url) as store:
        with pytest.raises(InvalidArgumentError):
            store.set_labels("s", labels)  # type: ignore[arg-type]
        assert store.list_sessions() == [] and store.sessions() == []


@pytest.mark.parametrize(
    "kw",
    [
        {"limit": 0},
        {"limit": True},
        {"order": "size"},
        {"after": "not a cursor"},
        {"after": 3},
        {"updated_since": "yesterday"},
        {"prefix": 1},
        {"labels": {"k": 2}},
    ],
    ids=lambda kw: next(iter(kw)),
)
def test_bad_page_arguments_are_typed_errors(kw: dict[str, object], url: str) -> None:
    with SessionStore(url) as store:
        store.append_progress_entry("s", make_entry())
        with pytest.raises(InvalidArgumentError):
            store.sessions(**kw)  # type: ignore[arg-type]


def test_filters_prefix_and_updated_since(url: str) -> None:
    with SessionStore(url) as store:
        for sid in ("run-1", "run-2", "other"):
            store.append_progress_entry(sid, make_entry())
        cut = store.sessions("run-2")[0].updated
        store.append_progress_entry("other", make_entry(1))
        assert sorted(i.session_id for i in store.sessions("run-")) == ["run-1", "run-2"]
        assert [i.session_id for i in store.sessions(updated_since=cut)] == ["other", "run-2"]
        assert [i.session_id for i in store.sessions(updated_since=cut.isoformat())] == [
            "other",
            "run-2",
        ]


def test_the_async_store_pages_and_labels() -> None:
    async def run() -> list[SessionInfo]:
        async with AsyncSessionStore("memory://") as store:
            await store.set_labels("a", {"k": "v"})
            await store.append_progress_entry("b", make_entry())
            assert await store.list_sessions("a") == ["a"]
            assert await store.rebuild_index() == 2
            return await store.sessions(labels={"k": "v"})

    assert [i.session_id for i in asyncio.run(run())] == ["a"]


def test_cli_sessions_pages_and_filters(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "store"
    with SessionStore(root) as store:
        for i in range(5):
            store.append_progress_entry(f"agent-{i}", make_entry(i))
        store.set_labels("agent-1", {"team": "red"})
    code, out, err = cli_in_process(capsys, "sessions", str(root), "--limit", "2", "--json")
    first = json.loads(out)
    assert code == 0 and [r["session_id"] for r in first] == ["agent-1", "agent-4"]
    code, out, err = cli_in_process(
        capsys, "sessions", str(root), "--limit", "2", "--after", first[-1]["cursor"]
    )
    rows = [line.split()[0] for line in out.splitlines()[1:]]
    assert code == 0 and rows == ["agent-3", "agent-2"] and "next page: --after" in err
    code, out, _ = cli_in_process(capsys, "sessions", str(root), "--label", "team=red")
    assert code == 0 and "agent-1" in out and "team=red" in out and "agent-2" not in out
    code, out, _ = cli_in_process(
        capsys, "sessions", str(root), "--prefix", "agent-3", "--updated-since", "1h", "--json"
    )
    assert [r["session_id"] for r in json.loads(out)] == ["agent-3"]
    code, out, err = cli_in_process(capsys, "sessions", str(root), "--rebuild", "--order", "id")
    assert code == 0 and "rebuilt the session index: 5 sessions" in err
    code, _, err = cli_in_process(capsys, "sessions", str(root), "--label", "team")
    assert code == 2 and "K=V" in err
    code, _, err = cli_in_process(capsys, "sessions", str(root), "--after", "nope")
    assert code != 0 and "cursor" in err


# -- attacks: paging beside writers ----------------------------------------------------


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    n=st.integers(1, 9),
    limit=st.integers(1, 4),
    order=st.sampled_from(["updated", "created", "id"]),
    writes=st.lists(st.lists(st.integers(0, 11), max_size=3), max_size=8),
)
def test_a_walk_through_pages_beside_writes_lists_each_session_at_most_once(
    case: EngineCase,
    tmp_path: Path,
    n: int,
    limit: int,
    order: str,
    writes: list[list[int]],
) -> None:
    """Between pages, writes move sessions (order="updated") and create new ones (ids
    >= n). No session appears twice; each that existed before the walk and was not
    written during it appears exactly once; with keys that never change ("created",
    "id") every one that existed before the walk appears exactly once."""
    with SessionStore(case.fresh(tmp_path / uuid.uuid4().hex)) as store:
        for i in range(n):
            store.append_progress_entry(f"s{i:02d}", make_entry(i))
        before = set(store.list_sessions())
        written: set[str] = set()
        seen: list[str] = []
        after: SessionInfo | None = None
        rounds = iter(writes)
        while page := store.sessions(limit=limit, after=after, order=order):
            keys = [
                (i.session_id,) if order == "id" else (getattr(i, order), i.session_id)
                for i in page
            ]
            assert keys == sorted(keys, reverse=order != "id")
            seen += [i.session_id for i in page]
            after = page[-1]
            for k in next(rounds, []):
                sid = f"s{k:02d}"
                store.append_progress_entry(sid, make_entry(k))
                written.add(sid)
        assert len(seen) == len(set(seen)), "a session appeared twice"
        must = before if order != "updated" else before - written
        assert must <= set(seen)
        assert set(seen) <= set(store.list_sessions())


def test_threads_writing_while_pages_are_walked_by_creation(url: str) -> None:
    """Writers in threads move sessions and create new ones while a reader walks pages
    by creation time: every session that existed before appears exactly once."""
    with SessionStore(url) as store:
        for i in range(40):
            store.append_progress_entry(f"s{i:02d}", make_entry(i))
        before = set(store.list_sessions())
        stop = threading.Event()

        def write(k: int) -> None:
            j = 0
            while not stop.is_set() and j < 60:  # bounded: a scan engine's pages read all
                store.append_progress_entry(f"s{(j * 7 + k) % 40:02d}", make_entry(j))
                store.append_progress_entry(f"new-{k}-{j}", make_entry(j))
                j += 1

        threads = [threading.Thread(target=write, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        try:
            seen: list[str] = []
            after = None
            while page := store.sessions(limit=3, after=after, order="created"):
                seen += [i.session_id for i in page]
                after = page[-1]
        finally:
            stop.set()
            for t in threads:
                t.join()
        assert len(seen) == len(set(seen)) and before <= set(seen)


# -- attacks: the file engine's index file -----------------------------------------------


def _first_appends_until_killed(root: Path, start: int) -> None:
    with SessionStore(root) as store:
        i = start
        while True:
            store.append_progress_entry(f"k{i:05d}", make_entry(i))
            store.append_progress_entry(f"k{i:05d}", make_entry(i + 1))
            i += 1


@pytest.mark.parametrize("durability", ["flush", "fsync"])
def test_sigkill_while_the_index_is_updated_never_hides_a_session(
    tmp_path: Path, durability: str
) -> None:
    """A writer creating sessions as fast as it can is killed (SIGKILL) at a random
    moment, five times: a fresh store's pages then list exactly the sessions that have
    a log, each with the head its log has, with no rebuild asked for."""
    root = tmp_path / "store"
    SessionStore(root).close()
    for round_ in range(5):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child is killed
            try:
                _first_appends_until_killed(root, round_ * 10_000)
            finally:
                os._exit(0)
        time.sleep(0.15 + 0.05 * round_)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    with SessionStore(root, durability=durability) as store:  # type: ignore[arg-type]
        # (a kill between creating a log and writing to it leaves an empty log, which
        # list_sessions names: a session with no committed line, which pages skip)
        ids = [sid for sid in store.list_sessions() if store.last_seq(sid) > 0]
        assert len(ids) > 5
        page = {i.session_id: i for i in store.sessions()}
        assert sorted(page) == ids
        for sid, info in page.items():
            assert info.last_seq == store.last_seq(sid)
        # and the walk in pages agrees
        walked: list[str] = []
        after = None
        while chunk := store.sessions(limit=7, after=after, order="id"):
            walked += [i.session_id for i in chunk]
            after = chunk[-1]
        assert walked == ids


def test_a_damaged_index_file_is_set_aside_and_rebuilt(tmp_path: Path) -> None:
    root = tmp_path / "store"
    with SessionStore(root) as store:
        store.set_labels("a", {"k": "v"})
        store.append_progress_entry("b", make_entry())
    (root / "index.sqlite3").write_bytes(b"not a database, " * 100)
    for suffix in ("-wal", "-shm"):
        (root / f"index.sqlite3{suffix}").unlink(missing_ok=True)
    with SessionStore(root) as store:
        store.append_progress_entry("c", make_entry())  # the write is never refused
        assert sorted(i.session_id for i in store.sessions()) == ["a", "b", "c"]
        assert store.sessions(labels={"k": "v"})[0].session_id == "a"
    assert any(p.name.startswith("index.sqlite3.damaged-") for p in root.iterdir())


@pytest.mark.parametrize("first", ["page", "append"])
def test_an_index_damaged_past_its_header_is_set_aside_and_rebuilt(
    tmp_path: Path, first: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An index whose pages past the first were garbled (what a power loss while it was
    made without a flush, or a bad disk, can leave) opens, then fails a read: the use
    that trips on it (a page, or a write's row) sets it aside; no page fails or misses a
    session, no write is refused, and the pages after read the index made anew."""
    root = tmp_path / "store"
    ids = [f"s{i:03d}" for i in range(120)]
    with SessionStore(root) as store:
        for sid in ids:
            store.append_progress_entry(sid, make_entry())
    for suffix in ("-wal", "-shm"):
        (root / f"index.sqlite3{suffix}").unlink(missing_ok=True)
    index = root / "index.sqlite3"
    size = index.stat().st_size
    assert size > 3 * 4096  # the header's page, and rows on others
    index.write_bytes(index.read_bytes()[:4096] + b"\x5a" * (size - 4096))
    with SessionStore(root) as store:
        if first == "append":
            store.append_progress_entry("s000", make_entry())
        assert sorted(i.session_id for i in store.sessions()) == ids
        caplog.clear()
        store.append_progress_entry("s001", make_entry())
        assert sorted(i.session_id for i in store.sessions()) == ids
        assert store.sessions(limit=1)[0].session_id == "s001"
        assert caplog.records == []  # served by the new index: no scan, no warning
    assert sum(p.name.startswith("index.sqlite3.damaged-") for p in root.iterdir()) == 1


@pytest.mark.parametrize(
    ("planted", "name"),
    [
        ("symlink", "index.sqlite3"),
        ("symlink", "index.sqlite3-wal"),
        ("symlink", "index.sqlite3-journal"),
        ("hard link", "index.sqlite3"),
    ],
)
def test_a_link_planted_as_the_index_is_set_aside_never_written_through(
    tmp_path: Path, planted: str, name: str
) -> None:
    """A link at the index's name (or its WAL's, or its journal's) to someone else's
    database, the index then made anew: SQLite follows links, so the store would make
    its tables there and write its rows (and trust that index, missing every session it
    lacks). It sets the link aside instead: the other file is left as it was, and every
    session is listed."""
    root = tmp_path / "store"
    with SessionStore(root) as store:
        store.append_progress_entry("a", make_entry())
    other = tmp_path / "other.sqlite3"
    with contextlib.closing(sqlite3.connect(other)) as conn:
        conn.execute("CREATE TABLE kept (x)")
        conn.execute("INSERT INTO kept VALUES ('theirs')")
        conn.commit()
    before = other.read_bytes()
    for p in root.iterdir():
        if p.name.startswith("index."):
            p.unlink()  # (the index is made anew, through the planted name)
    if planted == "symlink":
        (root / name).symlink_to(other)
    else:
        os.link(other, root / name)
    with SessionStore(root) as store:
        store.append_progress_entry("b", make_entry())
        assert sorted(i.session_id for i in store.sessions()) == ["a", "b"]
    assert other.read_bytes() == before
    assert not (tmp_path / "other.sqlite3-wal").exists()
    assert sum(p.name.startswith("index.sqlite3.damaged-") for p in root.iterdir()) >= 1


@pytest.mark.timeout(30)  # (the FIFO: an open that blocks hangs the append)
@pytest.mark.parametrize("planted", ["symlink", "directory", "fifo"])
def test_something_planted_as_the_stale_marker_fails_no_write_and_no_page(
    tmp_path: Path, planted: str
) -> None:
    """A link, a directory or a FIFO at the name of the marker that makes the next page
    rebuild the index (`index.stale`), then an index that refuses a write (damaged): the
    write and the pages go on, every session is listed, and what a link points at is
    left as it was."""
    root = tmp_path / "store"
    with SessionStore(root) as store:
        store.append_progress_entry("a", make_entry())
    theirs = tmp_path / "theirs"
    theirs.write_bytes(b"keep")
    marker = root / "index.stale"
    if planted == "symlink":
        marker.symlink_to(theirs)
    elif planted == "fifo":
        os.mkfifo(marker)
    else:
        marker.mkdir()
        (marker / "x").write_bytes(b"keep")
    (root / "index.sqlite3").write_bytes(b"not a database, " * 100)
    with SessionStore(root) as store:
        store.append_progress_entry("a", make_entry())  # (raised after writing its line)
        store.append_progress_entry("b", make_entry())
        for _ in range(2):
            assert sorted(i.session_id for i in store.sessions()) == ["a", "b"]
    assert theirs.read_bytes() == b"keep"


@pytest.mark.parametrize(
    "garble",
    [
        "UPDATE sessions SET labels = 'not json' WHERE id = 's1'",
        "UPDATE sessions SET labels = '[1, 2]' WHERE id = 's1'",
        "UPDATE sessions SET created = 'abc' WHERE id = 's0'",
        "UPDATE sessions SET updated = X'00' WHERE id = 's2'",
        "INSERT INTO sessions VALUES ('ghost', 0, 99999999999999999, 1, 1, 10, 'x', 0)",
    ],
)
def test_an_index_row_that_does_not_parse_costs_one_scan_never_a_page(
    tmp_path: Path, garble: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A row of a sound SQLite file that is not one the index wrote (another program's,
    a flipped bit): the page that reads it lists every session from the logs instead
    of raising, and the index rebuilt by the next page serves the pages after."""
    root = tmp_path / "store"
    with SessionStore(root) as store:
        for sid in ("s0", "s1", "s2"):
            store.append_progress_entry(sid, make_entry())
        store.set_labels("s1", {"k": "v"})
    with contextlib.closing(sqlite3.connect(root / "index.sqlite3")) as conn:
        conn.execute(garble)
        conn.commit()
    with SessionStore(root) as store:
        assert sorted(i.session_id for i in store.sessions()) == ["s0", "s1", "s2"]
        store.sessions()  # (the rebuild)
        caplog.clear()
        assert sorted(i.session_id for i in store.sessions()) == ["s0", "s1", "s2"]
        assert [i.session_id for i in store.sessions(labels={"k": "v"})] == ["s1"]
        assert caplog.records == []


def test_a_store_written_before_the_index_is_indexed_on_its_first_page(tmp_path: Path) -> None:
    root = tmp_path / "store"
    with SessionStore(root) as store:
        for sid in ("a", "b"):
            store.append_progress_entry(sid, make_entry())
        store.set_labels("b", {"k": "v"})
    for p in root.iterdir():
        if p.name.startswith("index."):
            p.unlink()  # as a release without the index leaves a store
    with SessionStore(root) as store:
        store.append_progress_entry("c", make_entry())
        assert sorted(i.session_id for i in store.sessions()) == ["a", "b", "c"]
        assert store.sessions(labels={"k": "v"})[0].session_id == "b"


def test_a_store_whose_index_cannot_be_made_pages_by_reading_the_logs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A copy of a store without its index, where nothing may be created (a read-only
    backup, a full disk): a page reads every session instead of failing, says so, and
    writes nothing."""
    root = tmp_path / "store"
    with SessionStore(root) as store:
        for sid in ("a", "b", "c"):
            store.append_progress_entry(sid, make_entry())
        store.set_labels("b", {"k": "v"})
    for p in root.iterdir():
        if p.name.startswith("index."):
            p.unlink()
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    real_open = os.open

    def read_only(path: object, flags: int, *a: object, **k: object) -> int:
        if flags & (os.O_CREAT | os.O_WRONLY | os.O_RDWR):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *a, **k)  # type: ignore[arg-type]

    with SessionStore(root, caches=False) as store:
        monkeypatch.setattr(os, "open", read_only)
        ids = [i.session_id for i in store.sessions(order="id", limit=2)]
        (labelled,) = store.sessions(labels={"k": "v"})
        monkeypatch.undo()
    assert ids == ["a", "b"] and labelled.session_id == "b"
    assert "the session index cannot be used" in caplog.text
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before


def test_another_process_sees_a_writers_rows_once_it_closes(tmp_path: Path) -> None:
    """Appends to a session indexed less than a second ago wait to be indexed; the
    writer's own pages and its close write them, and a reader's page corrects a row it
    reaches whose log grew meanwhile."""
    root = tmp_path / "store"
    writer, reader = SessionStore(root), SessionStore(root)
    try:
        writer.append_progress_entry("a", make_entry())
        writer.append_progress_entry("b", make_entry())
        for i in range(5):
            writer.append_progress_entry("a", make_entry(i))
        (a,) = reader.sessions("a")
        assert a.last_seq == 6  # corrected from its log as the page reached it
        assert [i.session_id for i in writer.sessions()] == ["a", "b"]
        writer.append_progress_entry("b", make_entry(9))
        writer.close()
        assert [(i.session_id, i.last_seq) for i in reader.sessions()] == [("b", 2), ("a", 6)]
    finally:
        writer.close()
        reader.close()


def test_an_open_writers_rows_reach_other_pages_within_the_lag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: a writer that appends, then stays open without writing or paging (a
    server between turns). Its row waited for its next write past the lag, a page or
    close: another process's page of sessions updated since then missed the session
    however long it waited. A thread now writes it within `INDEX_LAG`."""
    monkeypatch.setattr(index_lag, "INDEX_LAG", 0.05)
    root = tmp_path / "store"
    with SessionStore(root) as writer, SessionStore(root) as reader:
        writer.append_progress_entry("a", make_entry(0))  # created: its row at once
        since = datetime.now(UTC)
        writer.append_progress_entry("a", make_entry(1))
        deadline = time.monotonic() + 30
        while not reader.sessions(updated_since=since):
            assert time.monotonic() < deadline, "the writer's row never reached the index"
            time.sleep(0.01)
        assert [(i.session_id, i.last_seq) for i in reader.sessions(updated_since=since)] == [
            ("a", 2)
        ]


def test_an_append_never_waits_for_a_locked_index(tmp_path: Path) -> None:
    """Attack: another process holds the session index locked (a long transaction, a
    tool reading it) when a fresh process appends to a session it has. The append
    waited out SQLite's busy timeout (10 s) for the row; now it returns at once and the
    row is written once the lock is let go."""
    root = tmp_path / "store"
    with SessionStore(root) as store:
        store.append_progress_entry("a", make_entry(0))
    with SessionStore(root) as store:
        locker = sqlite3.connect(root / "index.sqlite3", isolation_level=None)
        locker.execute("BEGIN EXCLUSIVE")
        try:
            append = threading.Thread(target=store.append_progress_entry, args=("a", make_entry(1)))
            append.start()
            append.join(timeout=5)  # a hang detector: the busy timeout is 10 s
            assert not append.is_alive(), "the append waited for the index's lock"
        finally:
            locker.execute("ROLLBACK")
            locker.close()
        append.join()
        assert store.last_seq("a") == 2
    with SessionStore(root) as store:
        assert [(i.session_id, i.last_seq) for i in store.sessions()] == [("a", 2)]


_EXIT_WITHOUT_CLOSE = """
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from eventstore import ProgressEntry, SessionStore
store = SessionStore(sys.argv[1])
store.append_progress_entry("a", ProgressEntry(run_id="r", summary="first"))
print(datetime.now(UTC).isoformat(), flush=True)
store.append_progress_entry("a", ProgressEntry(run_id="r", summary="second"))
"""


def test_a_process_that_exits_without_close_leaves_its_rows_written(tmp_path: Path) -> None:
    """Attack: a script appends and exits without `close` (the thread is a daemon, its
    rows were dropped): a page of sessions updated since then missed the session until
    some page without that filter reached it; nothing may be printed either."""
    root = tmp_path / "store"
    done = subprocess.run(
        [sys.executable, "-c", _EXIT_WITHOUT_CLOSE, str(root)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stderr) == (0, "")
    with SessionStore(root) as store:
        page = store.sessions(updated_since=done.stdout.strip())
        assert [(i.session_id, i.last_seq) for i in page] == [("a", 2)]


_APPEND_THEN_EXIT = """
import sys, time
from datetime import UTC, datetime
from eventstore import ProgressEntry, SessionStore
from eventstore.engines.file.index_lag import INDEX_LAG
store = SessionStore(sys.argv[1])
print(datetime.now(UTC).isoformat(), flush=True)
store.append_progress_entry("a", ProgressEntry(run_id="r", summary="second"))
if sys.argv[2] == "while-its-thread-writes":
    time.sleep(INDEX_LAG + 0.5)  # the thread's write has begun, held up by the lock
"""


def _exit_while_the_index_is_locked(
    root: Path, script: str, *args: str
) -> subprocess.CompletedProcess[str]:
    """Run `script` (argv: the store's root, then `args`) in a child process to its
    exit while this process holds the store's index locked (`BEGIN EXCLUSIVE`)."""
    locker = sqlite3.connect(root / INDEX_NAME, isolation_level=None)
    locker.execute("BEGIN EXCLUSIVE")
    try:
        # a bound on the behaviour (SQLite's busy timeout is 10 s; forty stores each
        # waiting EXIT_WAIT took as long), not a speed limit
        return subprocess.run(
            [sys.executable, "-c", script, str(root), *args],
            capture_output=True,
            text=True,
            timeout=8,
        )
    finally:
        locker.execute("ROLLBACK")
        locker.close()


@pytest.mark.parametrize("when", ["at-once", "while-its-thread-writes"])
def test_an_exit_never_waits_out_a_locked_index_and_its_rows_are_not_lost(
    tmp_path: Path, when: str
) -> None:
    """Attack: a process appends and exits without `close` while another process holds
    the session index locked: its exit waited out SQLite's busy timeout (10 s) for its
    waiting rows (or for its thread's write, held up so). It now waits `EXIT_WAIT` and
    leaves the index stale: a page after the lock is let go, filtered by the time the
    row was written, still finds the session at its latest seq."""
    root = tmp_path / "store"
    with SessionStore(root) as store:
        store.append_progress_entry("a", make_entry(0))
    done = _exit_while_the_index_is_locked(root, _APPEND_THEN_EXIT, when)
    assert done.returncode == 0, done.stderr
    with SessionStore(root) as store:
        page = store.sessions(updated_since=done.stdout.strip())
        assert [(i.session_id, i.last_seq) for i in page] == [("a", 2)]


_EXIT_BESIDE_A_HELD_THREAD = """
import sys, threading, time
from eventstore import ProgressEntry, SessionStore
store = SessionStore(sys.argv[1])
store.append_progress_entry("a", ProgressEntry(run_id="r", summary="second"))
def create() -> None:  # a new session's row is written at once: it waits for the lock
    store.append_progress_entry("b", ProgressEntry(run_id="r", summary="first"))
threading.Thread(target=create, daemon=True).start()
time.sleep(0.5)  # the thread waits for the index, holding this process's use of it
"""


def test_an_exit_beside_a_thread_held_up_by_a_locked_index_does_not_wait_for_it(
    tmp_path: Path,
) -> None:
    """Attack: a process exits without `close` while a daemon thread of its own writes
    a new session's row, held up by another process's lock on the index: the exit's
    write of its waiting rows waited for that thread (SQLite's busy timeout, 10 s)
    before its own `EXIT_WAIT`. It waits `EXIT_WAIT` for the thread too, and leaves
    the index stale: a page after the lock is let go lists every session at its
    latest seq."""
    root = tmp_path / "store"
    with SessionStore(root) as store:
        store.append_progress_entry("a", make_entry(0))
    done = _exit_while_the_index_is_locked(root, _EXIT_BESIDE_A_HELD_THREAD)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    with SessionStore(root) as store:
        page = sorted((i.session_id, i.last_seq) for i in store.sessions())
        # (the thread's append, never acknowledged, may have stopped before its log)
        assert page == [(sid, store.last_seq(sid)) for sid in store.list_sessions()]
        assert ("a", 2) in page


_MANY_STORES_THEN_EXIT = """
import sys
from eventstore import ProgressEntry, SessionStore
stores = [SessionStore(sys.argv[1]) for _ in range(40)]
for k, store in enumerate(stores):  # each store's row waits, for its own session
    store.append_progress_entry(f"s{k}", ProgressEntry(run_id="r", summary="second"))
"""


def test_an_exit_with_many_stores_waits_exit_wait_in_all_for_a_locked_index(
    tmp_path: Path,
) -> None:
    """Attack: a process with forty stores open, each with a row waiting, exits without
    `close` while another process holds the index locked: each store waited its own
    `EXIT_WAIT`, forty of them SQLite's ten seconds again. The exit waits `EXIT_WAIT`
    in all, then leaves the index stale: a page after the lock is let go lists every
    session at its latest seq."""
    root = tmp_path / "store"
    with SessionStore(root) as store:
        for k in range(40):
            store.append_progress_entry(f"s{k}", make_entry(0))
    done = _exit_while_the_index_is_locked(root, _MANY_STORES_THEN_EXIT)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    with SessionStore(root) as store:
        page = sorted((i.session_id, i.last_seq) for i in store.sessions(limit=100))
        assert page == sorted((f"s{k}", 2) for k in range(40))


def test_an_append_when_no_thread_can_start_still_succeeds_and_is_indexed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: no thread can be started (a process or container at its thread limit;
    from Python 3.12, an atexit handler): the append, its line already in the log,
    raised RuntimeError. It now returns, its row written at once."""

    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    root = tmp_path / "store"
    with SessionStore(root) as store:
        store.append_progress_entry("a", make_entry(0))
        monkeypatch.setattr(threading.Thread, "start", refuse)
        store.append_progress_entry("a", make_entry(1))
        monkeypatch.undo()
        with SessionStore(root) as reader:
            assert [(i.session_id, i.last_seq) for i in reader.sessions()] == [("a", 2)]


_LOCK_THE_INDEX = """
import sqlite3, sys, time
index = sqlite3.connect(sys.argv[1], isolation_level=None)
index.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
time.sleep(0.5)
index.execute("ROLLBACK")
"""


def test_a_fork_while_the_thread_writes_leaves_parent_and_child_working(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: a process forks while its index thread is in the middle of a write (held
    up by another process's lock on the index): the child, which has the thread's lock
    held and no thread, appends and pages; the parent's own row still reaches the index."""
    monkeypatch.setattr(index_lag, "INDEX_LAG", 0.01)
    root = tmp_path / "store"
    with SessionStore(root) as store:
        store.append_progress_entry("a", make_entry(0))
        store.append_progress_entry("p", make_entry(0))
        locker = subprocess.Popen(
            [sys.executable, "-c", _LOCK_THE_INDEX, str(root / "index.sqlite3")],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert locker.stdout is not None and locker.stdout.readline() == "locked\n"
        store.append_progress_entry("p", make_entry(1))  # the thread waits on the lock
        time.sleep(0.1)

        def child() -> bool:
            store.append_progress_entry("a", make_entry(1))
            store.append_progress_entry("b", make_entry(0))
            store.append_progress_entry("b", make_entry(1))
            page = [(i.session_id, i.last_seq) for i in store.sessions()]
            return page[:2] == [("b", 2), ("a", 2)]

        assert in_forked_child(child, 60) == 0
        assert locker.wait(timeout=60) == 0
    index = sqlite3.connect(root / "index.sqlite3")
    try:
        rows = index.execute("SELECT id, last_seq FROM sessions ORDER BY id").fetchall()
    finally:
        index.close()
    assert rows == [("a", 2), ("b", 2), ("p", 2)]  # the parent's row, by the parent


def test_a_row_being_written_never_brings_back_a_purged_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: the thread has taken a session's waiting row and is about to write it
    when the session is purged: the purge's drop of the row landed first, and the row
    written after brought the session back into the index file."""
    monkeypatch.setattr(index_lag, "INDEX_LAG", 0.01)
    taken, go = threading.Event(), threading.Event()
    real = FileIndex.put_appended

    def slow(
        self: FileIndex, entries: Sequence[tuple[IndexEntry, bool]], *, busy_ms: int | None = None
    ) -> None:
        if threading.current_thread() is not threading.main_thread():
            taken.set()
            go.wait(timeout=30)
        real(self, entries, busy_ms=busy_ms)

    monkeypatch.setattr(FileIndex, "put_appended", slow)
    root = tmp_path / "store"
    with SessionStore(root) as store:
        store.append_progress_entry("a", make_entry(0))
        store.append_progress_entry("a", make_entry(1))  # its row waits for the thread
        assert taken.wait(timeout=30)
        purge = threading.Thread(target=store.delete_session, args=("a",), kwargs={"purge": True})
        purge.start()
        purge.join(timeout=0.2)  # (the fixed purge waits for the write: let it start)
        go.set()
        purge.join()
        assert store.list_sessions() == []
    index = sqlite3.connect(root / "index.sqlite3")
    try:
        assert index.execute("SELECT id FROM sessions").fetchall() == []
    finally:
        index.close()


@pytest.mark.skipif(POSTGRES_URL is None, reason="EVENTSTORE_TEST_POSTGRES_URL is not set")
def test_a_postgres_store_migrated_with_sessions_is_indexed_on_its_first_page(
    tmp_path: Path,
) -> None:
    """Schema v4 marks a store that had sessions (`index_stale` in `meta`): its rows have
    no times or labels yet, and the first page rebuilds them from the logs."""
    import psycopg

    from eventstore.engines.postgres import engine as pg

    url = fresh_postgres(tmp_path)
    with SessionStore(url) as store:
        store.append_progress_entry("a", make_entry())
        store.set_labels("b", {"k": "v"})
        before = store.sessions()
    conninfo, schema = pg.split_url(url)
    q = pg.quote_schema(schema)
    with psycopg.connect(conninfo, autocommit=True) as conn:  # as version 2 left them
        conn.execute(f"UPDATE {q}.sessions SET created_us = 0, updated_us = 0, labels = '{{}}'")
        conn.execute(f"INSERT INTO {q}.meta VALUES ('index_stale', '1')")
    with SessionStore(url) as store:
        assert store.sessions() == before
        assert store.sessions(labels={"k": "v"})[0].session_id == "b"
    with psycopg.connect(conninfo, autocommit=True) as conn:
        assert conn.execute(f"SELECT 1 FROM {q}.meta WHERE name = 'index_stale'").fetchone() is None


def test_a_session_whose_log_is_damaged_is_still_listed(url: str, case: EngineCase) -> None:
    with SessionStore(url) as store:
        for sid in ("a", "b"):
            store.append_progress_entry(sid, make_entry())
            store.append_progress_entry(sid, make_entry(1))
        case.rewrite(store, "a", lambda data: data + b'{"type":"progress_appended","seq":3}\n')
    with SessionStore(url) as store:
        assert sorted(i.session_id for i in store.sessions()) == ["a", "b"]


def test_a_deleted_session_is_listed_as_deleted(url: str) -> None:
    with SessionStore(url) as store:
        for sid in ("a", "b"):
            store.append_progress_entry(sid, make_entry())
            store.append_progress_entry(sid, make_entry(1))
        store.delete_session("a")
        by_id = {i.session_id: i for i in store.sessions()}
        assert by_id["a"].deleted is True and by_id["b"].deleted is False
        assert store.list_sessions() == ["b"]
