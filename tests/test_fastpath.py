"""The file engine's writer fast path: descriptors kept open between appends, and what
must still hold with them (issue 14, item 1).

Attacks: another process (or store instance: its own descriptors, its own open file
descriptions) appends, compacts, repairs or removes the session between two appends of
a writer whose descriptors are cached; a fork while the parent holds the lock; more
sessions than the cache holds, with one of them in use; a torn tail under cached
descriptors; portalocker in another process against our direct flock, both ways.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from conftest import log_path, make_entry, make_features, make_manifest, wait_child

from eventstore import SessionStore
from eventstore.engines.file import engine as file_engine
from eventstore.engines.file import session as file_session
from eventstore.engines.file.engine import FileEngine
from eventstore.engines.file.layout import SessionPaths

REPO = Path(__file__).resolve().parent.parent


def _engine(store: SessionStore) -> FileEngine:
    assert isinstance(store.engine, FileEngine)
    return store.engine


def _summaries(store: SessionStore, sid: str) -> list[str]:
    return [p.summary for p in store.load_bootstrap_state(sid).recent_progress]


def _lock_bytes(root: Path, sid: str) -> bytes:
    return SessionPaths(root, sid).lock.read_bytes()


# -- the same OS lock as portalocker, across processes ----------------------------------

_HOLD_WITH_PORTALOCKER = """
import sys, portalocker
fh = open(sys.argv[1], "a+b")
portalocker.lock(fh, portalocker.LockFlags.EXCLUSIVE)
print("locked", flush=True)
sys.stdin.readline()
portalocker.unlock(fh)
"""

_TRY_WITH_PORTALOCKER = """
import sys, portalocker
fh = open(sys.argv[1], "a+b")
try:
    portalocker.lock(fh, portalocker.LockFlags.EXCLUSIVE | portalocker.LockFlags.NON_BLOCKING)
except portalocker.exceptions.LockException:
    print("busy")
else:
    print("free")
"""


def test_portalocker_in_another_process_excludes_the_fast_path_append(root: Path) -> None:
    """A process locking the way every release did (portalocker) holds off an append."""
    with SessionStore(root) as store:
        store.append_progress_entry("s", make_entry(0))  # descriptors now cached
        holder = subprocess.Popen(
            [sys.executable, "-c", _HOLD_WITH_PORTALOCKER, str(SessionPaths(root, "s").lock)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
            done = threading.Event()
            t = threading.Thread(
                target=lambda: (store.append_progress_entry("s", make_entry(1)), done.set())
            )
            t.start()
            assert not done.wait(0.5), "the append did not wait for portalocker's lock"
            assert holder.stdin is not None
            holder.stdin.write("\n")
            holder.stdin.flush()
            assert done.wait(30)
            t.join()
        finally:
            holder.kill()
            holder.wait()
        assert _summaries(store, "s") == ["step 0", "step 1"]


def test_the_fast_path_lock_excludes_portalocker_in_another_process(root: Path) -> None:
    with SessionStore(root) as store:
        store.append_progress_entry("s", make_entry(0))
        engine = _engine(store)
        sess = engine._session("s")
        lock = str(SessionPaths(root, "s").lock)

        def probe() -> str:
            run = subprocess.run(
                [sys.executable, "-c", _TRY_WITH_PORTALOCKER, lock],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert run.returncode == 0, run.stderr
            return run.stdout.strip()

        with sess.lock:
            assert engine._acquire(sess, True)
            try:
                assert probe() == "busy"
            finally:
                file_session.unlock(sess.lock_fd)
        assert probe() == "free"


# -- what another writer did is seen under the lock ---------------------------------------


def test_appends_by_another_instance_are_seen_and_chained(root: Path) -> None:
    with SessionStore(root) as a, SessionStore(root) as b:
        for i in range(0, 12, 2):
            a.append_progress_entry("s", make_entry(i))
            b.append_progress_entry("s", make_entry(i + 1))
        assert a.verify("s").ok
        assert _summaries(a, "s") == [f"step {i}" for i in range(12)]
        assert a.last_seq("s") == 12


def test_a_compaction_elsewhere_moves_the_cached_writer_to_the_new_log(root: Path) -> None:
    with SessionStore(root) as a, SessionStore(root) as b:
        a.append_progress_entry("s", make_entry(0))
        a.append_progress_entry("s", make_entry(1))
        gen = _lock_bytes(root, "s")
        b.compact("s", force=True)
        assert _lock_bytes(root, "s") != gen  # the replacer bumped the generation
        a.append_progress_entry("s", make_entry(2))  # through descriptors cached before
        assert b"step 2" in log_path(root, "s").read_bytes()
        archived = b"".join(p.read_bytes() for p in log_path(root, "s").parent.glob("archive/*"))
        assert b"step 2" not in archived
        assert a.verify("s").ok
    with SessionStore(root) as c:
        assert _summaries(c, "s") == ["step 0", "step 1", "step 2"]


def test_a_log_replaced_without_a_generation_bump_is_noticed(root: Path) -> None:
    """A replacer that does not bump the generation (a 0.1.0 process compacting, a tool
    that rewrites the log by rename) must not leave the fast path appending to the old,
    unlinked file: the next append lands in the file at the path."""
    with SessionStore(root) as a:
        a.append_progress_entry("s", make_entry(0))
        a.append_progress_entry("s", make_entry(1))  # descriptors and head now cached
        gen = _lock_bytes(root, "s")
        log = log_path(root, "s")
        fresh = log.with_name("log.jsonl.new")
        fresh.write_bytes(log.read_bytes())  # the same lines, a new file (a new inode)
        os.chmod(fresh, 0o600)
        os.rename(fresh, log)
        assert _lock_bytes(root, "s") == gen
        a.append_progress_entry("s", make_entry(2))
        assert b"step 2" in log.read_bytes()
        assert a.verify("s").ok
    with SessionStore(root) as c:
        assert _summaries(c, "s") == ["step 0", "step 1", "step 2"]


def test_a_repair_elsewhere_moves_the_cached_writer_to_the_new_log(root: Path) -> None:
    with SessionStore(root) as a, SessionStore(root) as b:
        a.append_progress_entry("s", make_entry(0))
        with open(log_path(root, "s"), "ab") as f:
            f.write(b"not json\n")  # a bad last line: repair cuts it (a new file)
        gen = _lock_bytes(root, "s")
        from eventstore.ops.repair import repair

        report = repair(b, "s")
        assert report is not None
        assert _lock_bytes(root, "s") != gen
        a.append_progress_entry("s", make_entry(1))
        assert a.verify("s").ok
    with SessionStore(root) as c:
        assert _summaries(c, "s") == ["step 0", "step 1"]


def test_a_removal_elsewhere_is_seen_by_the_cached_writer(root: Path) -> None:
    with SessionStore(root) as a, SessionStore(root) as b:
        a.append_progress_entry("s", make_entry(0))
        a.append_progress_entry("s", make_entry(1))
        assert b.delete_session("s", purge=True) is True
        a.append_progress_entry("s", make_entry(2))  # a new session, not the removed file
        assert a.verify("s").ok
        assert a.last_seq("s") == 1
    with SessionStore(root) as c:
        assert _summaries(c, "s") == ["step 2"]
    sessions = SessionPaths(root, "s").dir.parent
    assert sorted(p.name for p in sessions.iterdir()) == ["s"]  # no trash left


def test_a_removal_in_this_instance_reopens_on_the_next_append(root: Path) -> None:
    with SessionStore(root) as a:
        a.append_progress_entry("s", make_entry(0))
        assert a.delete_session("s", purge=True) is True
        a.append_progress_entry("s", make_entry(1))
        assert _summaries(a, "s") == ["step 1"]
        assert log_path(root, "s").exists()


def test_a_torn_tail_under_cached_descriptors_is_set_aside(root: Path) -> None:
    with SessionStore(root) as a:
        a.append_progress_entry("s", make_entry(0))
        with open(log_path(root, "s"), "ab") as f:
            f.write(b'{"type":"progress_appended","seq":2,')
        a.append_progress_entry("s", make_entry(1))
        assert a.verify("s").ok
        assert _summaries(a, "s") == ["step 0", "step 1"]
    assert len(list(log_path(root, "s").parent.glob("log.jsonl.torn-*"))) == 1


# -- fork -------------------------------------------------------------------------------


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_does_not_share_the_parents_lock(root: Path) -> None:
    """The parent holds the writers' lock through its cached descriptor when it forks.
    flock does not exclude two users of one open file description: a child that kept
    the inherited descriptor would append while the parent holds the lock."""
    store = SessionStore(root)
    store.append_progress_entry("s", make_entry(0))
    engine = _engine(store)
    sess = engine._session("s")
    r, w = os.pipe()
    go_r, go_w = os.pipe()
    with sess.lock:
        assert engine._acquire(sess, True)
        pid = os.fork()
        if pid == 0:  # the child
            try:
                os.close(r)
                done = threading.Event()
                threading.Thread(
                    target=lambda: (store.append_progress_entry("s", make_entry(9)), done.set()),
                    daemon=True,
                ).start()
                early = done.wait(0.5)
                os.write(w, b"early" if early else b"waits")
                os.read(go_r, 1)  # the parent released
                os.write(w, b",done" if done.wait(30) else b",stuck")
            finally:
                os._exit(0)
        os.close(w)
        first = os.read(r, 5)
        file_session.unlock(sess.lock_fd)
    os.write(go_w, b"x")
    rest = os.read(r, 10)
    assert wait_child(pid, 60) == 0
    assert (first, rest) == (b"waits", b",done")
    store.append_progress_entry("s", make_entry(1))
    assert store.verify("s").ok
    assert _summaries(store, "s") == ["step 0", "step 9", "step 1"]
    store.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_closes_the_inherited_descriptors(root: Path) -> None:
    store = SessionStore(root)
    store.append_progress_entry("s", make_entry(0))
    sess = _engine(store)._session("s")
    inherited = (sess.lock_fd, sess.log_fd)
    assert min(inherited) >= 0
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            closed = []
            for fd in inherited:
                try:
                    os.fstat(fd)
                    closed.append(b"0")
                except OSError:
                    closed.append(b"1")
            os.write(w, b"".join(closed))
        finally:
            os._exit(0)
    os.close(w)
    got = os.read(r, 2)
    assert wait_child(pid, 60) == 0
    assert got == b"11"
    os.fstat(sess.lock_fd)  # the parent's stay open
    store.close()


# -- the bounded cache ------------------------------------------------------------------


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_the_descriptor_cache_is_bounded_and_spares_a_session_in_use(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(file_engine, "MAX_OPEN_SESSIONS", 3)
    with SessionStore(root) as store:
        engine = _engine(store)
        store.append_progress_entry("busy", make_entry(0))
        busy = engine._session("busy")
        before = _open_fds()
        with busy.lock:  # a writer is using these descriptors
            for i in range(10):
                store.append_progress_entry(f"s{i}", make_entry(i))
            os.fstat(busy.lock_fd)
            os.fstat(busy.log_fd)
            assert len(engine._open) <= 4  # the bound, plus the one in use
        assert _open_fds() - before <= 2 * 3
        for i in range(10):  # evicted sessions reopen on use
            store.append_progress_entry(f"s{i}", make_entry(i + 1))
            assert store.last_seq(f"s{i}") == 2
    assert _open_fds() <= before - 2  # close() closed them all


def test_close_closes_every_cached_descriptor(root: Path) -> None:
    store = SessionStore(root)
    store.append_progress_entry("s", make_entry(0))
    sess = _engine(store)._session("s")
    fds = (sess.lock_fd, sess.log_fd)
    store.close()
    for fd in fds:
        with pytest.raises(OSError):
            os.fstat(fd)


# -- durability and the "writes nothing, creates nothing" rule ----------------------------


def test_fsync_durability_datasyncs_once_per_batch(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    real = os.fdatasync if hasattr(os, "fdatasync") else os.fsync
    name = "fdatasync" if hasattr(os, "fdatasync") else "fsync"

    def counting(fd: int) -> None:
        calls.append(fd)
        real(fd)

    with SessionStore(root, durability="fsync") as store:
        store.append_progress_entry("s", make_entry(0))  # creates the log
        monkeypatch.setattr(os, name, counting)
        store.append_progress_entry("s", make_entry(1))
        store.append_transcript_messages("s", [])
        assert len(calls) == 2


def test_flush_durability_reaches_the_os_before_return(root: Path) -> None:
    with SessionStore(root) as store:
        for i in range(3):
            store.append_progress_entry("s", make_entry(i))
            # another open of the file (as a process killed right now would leave it)
            assert f"step {i}".encode() in log_path(root, "s").read_bytes()


def test_a_call_that_writes_nothing_creates_nothing(root: Path) -> None:
    with SessionStore(root) as store:
        store.initialize_session_if_missing("s", make_manifest("s"), make_features())
        with pytest.raises(KeyError):
            store.update_feature_pass("t", "nope", True)
        assert store.load_bootstrap_state("u").manifest is None
        assert store.initialize_session_if_missing("s", make_manifest("s"), []) is False
    sessions = SessionPaths(root, "s").dir.parent
    assert sorted(p.name for p in sessions.iterdir()) == ["s"]


def test_every_replacer_bumps_the_generation_under_the_lock(root: Path) -> None:
    with SessionStore(root) as store:
        for i in range(3):
            store.append_progress_entry("s", make_entry(i))
        seen = {_lock_bytes(root, "s")}
        store.compact("s", force=True)
        seen.add(_lock_bytes(root, "s"))
        engine = _engine(store)
        with engine.hold("s") as hold:
            hold.keep_prefix(len(hold.data) - 1, "test")
        seen.add(_lock_bytes(root, "s"))
        assert len(seen) == 3
        assert all(len(g) in (0, 8) for g in seen)


def test_the_fast_path_needs_no_portalocker_import() -> None:
    code = textwrap.dedent(
        """
        import sys, tempfile
        from eventstore import SessionStore, ProgressEntry
        with SessionStore(tempfile.mkdtemp()) as s:
            s.append_progress_entry("s", ProgressEntry(run_id="r", summary="x"))
            s.compact("s", force=True)
            s.delete_session("s", purge=True)
        assert "portalocker" not in sys.modules, "portalocker was imported"
        """
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def test_appends_from_many_threads_and_a_second_instance_lose_nothing(root: Path) -> None:
    with SessionStore(root) as a, SessionStore(root) as b:
        a.append_progress_entry("s", make_entry(0))

        def work(store: SessionStore, base: int) -> None:
            for i in range(25):
                store.append_progress_entry("s", make_entry(base + i))

        threads = [
            threading.Thread(target=work, args=(st, 1000 * (k + 1)))
            for k, st in enumerate((a, b, a, b))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert a.last_seq("s") == 101
        assert a.verify("s").ok
        assert len(set(_summaries(b, "s"))) == 101


def test_wait_sees_a_fast_path_append(root: Path) -> None:
    with SessionStore(root) as store:
        store.append_progress_entry("s", make_entry(0))
        pos = store.engine.read("s", None).head.position
        t0 = time.monotonic()
        store.append_progress_entry("s", make_entry(1))
        assert store.engine.wait("s", pos, 5.0)
        assert time.monotonic() - t0 < 5.0


# -- the hot path's records: frozen msgspec Structs -----------------------------------------------


def test_the_hot_path_records_are_frozen_and_equal_by_place() -> None:
    from eventstore.engines.base import (
        EncodedBatch,
        Head,
    )
    from eventstore.engines.file.engine import FilePosition
    from eventstore.store import AppendResult

    pos = FilePosition((1, 2), 10, 3, "l", "h", 1, 12)
    # `seen` (the size when read) is not part of the place
    assert pos == FilePosition((1, 2), 10, 3, "l", "h", 1, 99)
    assert hash(pos) == hash(FilePosition((1, 2), 10, 3, "l", "h", 1, 99))
    for other in (
        FilePosition((1, 3), 10, 3, "l", "h", 1, 12),
        FilePosition((1, 2), 11, 3, "l", "h", 1, 12),
        FilePosition((1, 2), 10, 4, "l", "h", 1, 12),
        FilePosition((1, 2), 10, 3, "m", "h", 1, 12),
        FilePosition((1, 2), 10, 3, "l", "i", 1, 12),
        FilePosition((1, 2), 10, 3, "l", "h", 2, 12),
    ):
        assert pos != other
    assert pos != (1, 2) and pos != None  # noqa: E711
    assert pos.head() == Head(3, "l", "h", pos, 10, 1)
    assert {pos.head(): 1}[Head(3, "l", "h", pos, 10, 1)] == 1
    assert EncodedBatch(b"x\n", 1, 1, ("h",), "h").lines() == [b"x"]
    batch = EncodedBatch(b"x\n", 1, 1, ("h",), "h")
    result = AppendResult(1, 2)
    for frozen, name in (
        (pos, "offset"),
        (pos.head(), "size"),
        (batch, "link"),
        (result, "first_seq"),
    ):
        with pytest.raises(AttributeError, match="immutable"):
            setattr(frozen, name, 0)
    assert result == AppendResult(1, 2, False) != AppendResult(1, 2, True)


def test_a_store_dropped_without_close_closes_its_descriptors(root: Path) -> None:
    """Stores are often dropped without close(): the cached descriptors must not leak
    (a test suite that leaked them ran out of select()-able descriptors)."""
    import gc

    store = SessionStore(root)
    for i in range(5):
        store.append_progress_entry(f"s{i}", make_entry(i))
    sessions = list(_engine(store)._sessions.values())
    fds = [fd for sess in sessions for fd in (sess.lock_fd, sess.log_fd)]
    assert len(fds) == 10 and min(fds) >= 0
    del store, sessions
    gc.collect()
    for fd in fds:
        with pytest.raises(OSError):
            os.fstat(fd)
