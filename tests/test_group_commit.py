"""Group commit (`eventstore/engines/file/groupflush.py`): durable appends that threads of
one process make to one session at once share one flush, each acknowledged only after a
flush that covers it; a failed shared flush fails every append it was to cover, stores
none of them, and leaves the store consistent.

Power loss at every point of such a run: `tests/test_crash_states.py`'s "threads sharing
flushes" workload (`test_fsync_durability_survives_every_crash_state`) and
`test_threads_durable_appends_share_flushes_under_the_recorder`.
"""

from __future__ import annotations

import errno
import multiprocessing
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import run_threads

from eventstore import Message, Role, SessionStore, StorageError

SID = "s"
WRITERS = 6


def _turn(text: str) -> list[Message]:
    return [Message(role=Role.USER, content=text)]


def _contents(root: Path, sid: str = SID) -> list[str]:
    with SessionStore(root, durability="fsync") as s:
        assert s.verify(sid).ok
        return [m.content for m in s.load_transcript_messages(sid)]


@contextmanager
def _counting_flushes() -> Iterator[list[int]]:
    """Count `os.fdatasync` calls (and `os.fsync`'s) while the block runs."""
    calls = [0]
    real = {name: getattr(os, name) for name in ("fdatasync", "fsync") if hasattr(os, name)}

    def counted(name: str):  # type: ignore[no-untyped-def]
        def call(fd: int) -> None:
            calls[0] += 1
            real[name](fd)

        return call

    for name in real:
        setattr(os, name, counted(name))
    try:
        yield calls
    finally:
        for name, fn in real.items():
            setattr(os, name, fn)


def _writers(store: SessionStore, n: int, each: int, sid: str = SID) -> list[object]:
    def work(w: int) -> None:
        for i in range(each):
            store.append_transcript_messages(sid, _turn(f"w{w}.{i}"))

    return [lambda w=w: work(w) for w in range(n)]  # type: ignore[misc]


def _in_writer_order(got: list[str], n: int, each: int) -> None:
    """Every writer's appends present once, each writer's in the order it made them."""
    assert Counter(got) == Counter(f"w{w}.{i}" for w in range(n) for i in range(each))
    for w in range(n):
        mine = [t for t in got if t.startswith(f"w{w}.")]
        assert mine == [f"w{w}.{i}" for i in range(each)]


def test_concurrent_durable_appends_share_flushes(tmp_path: Path) -> None:
    """Writers in threads appending durably to one session at once make fewer flushes
    than appends (a lone writer makes one an append), and every append is in the log
    once, each writer's in its order, the log verifying."""
    each = 20
    with SessionStore(tmp_path, durability="fsync") as s:
        s.append_transcript_messages(SID, _turn("seed"))  # the journal and its epoch
        with _counting_flushes() as flushes:
            errors = run_threads(_writers(s, WRITERS, each))  # type: ignore[arg-type]
        assert not errors, errors
    assert flushes[0] < WRITERS * each, f"{flushes[0]} flushes for {WRITERS * each} appends"
    got = _contents(tmp_path)
    assert got[0] == "seed"
    _in_writer_order(got[1:], WRITERS, each)


def test_a_lone_durable_writer_still_flushes_every_append(tmp_path: Path) -> None:
    """With nobody queued behind it a writer flushes before it returns (one flush an
    append): group commit never delays a lone writer's acknowledgement."""
    with SessionStore(tmp_path, durability="fsync") as s:
        s.append_transcript_messages(SID, _turn("seed"))
        with _counting_flushes() as flushes:
            for i in range(10):
                s.append_transcript_messages(SID, _turn(f"w0.{i}"))
        assert flushes[0] == 10


def _fail_flushes(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(fd: int) -> None:
        raise OSError(errno.EIO, "injected")

    for name in ("fdatasync", "fsync"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, broken)


def test_a_failed_shared_flush_stores_none_of_its_appends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every flush failing (EIO) while writers append at once: each append raises
    StorageError — the group's committing writer and the writers whose appends it was
    to cover alike — and none of them is in the log, to this store (its folds are
    forgotten) or to a fresh one; once the disk works again each retry stores its
    append once. At least one failure is a shared flush's (tried over several rounds)."""
    each = 4
    shared = 0
    with SessionStore(tmp_path, durability="fsync") as s:
        s.append_transcript_messages(SID, _turn("seed"))
        for _ in range(5):
            with monkeypatch.context() as m:
                _fail_flushes(m)
                errors = run_threads(_writers(s, WRITERS, 1))  # type: ignore[arg-type]
            assert len(errors) == WRITERS, errors
            assert all(isinstance(e, StorageError) for e in errors), errors
            shared += sum("shared" in str(e) or "group commit" in str(e) for e in errors)
            assert [m.content for m in s.load_transcript_messages(SID)] == ["seed"]
            if shared:
                break
        assert shared, "no group formed in five rounds"
        assert _contents(tmp_path) == ["seed"]
        errors = run_threads(_writers(s, WRITERS, each))  # type: ignore[arg-type]
        assert not errors, errors
        assert [m.content for m in s.load_transcript_messages(SID)][0] == "seed"
    got = _contents(tmp_path)
    _in_writer_order(got[1:], WRITERS, each)


def _child(root: str, w: int, acked: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    """Threads appending durably, each acknowledged append reported at once."""
    store = SessionStore(root, durability="fsync")

    def work(t: int) -> None:
        for i in range(10_000):
            token = f"w{w}-{t}.{i}"
            store.append_transcript_messages(SID, _turn(token))
            acked.put(token)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()


def test_processes_of_grouping_writers_killed_lose_no_acknowledged_append(
    tmp_path: Path,
) -> None:
    """Two processes of four threads each append durably to one session (groups form in
    each, their flock held across a group), and are killed (SIGKILL) mid-run: every
    append a writer was told of is in the log once, the log verifying, and a new writer
    appends after them."""
    with SessionStore(tmp_path, durability="fsync") as s:
        s.append_transcript_messages(SID, _turn("seed"))
    ctx = multiprocessing.get_context("spawn")
    acked: multiprocessing.Queue = ctx.Queue()  # type: ignore[type-arg]
    procs = [ctx.Process(target=_child, args=(str(tmp_path), w, acked)) for w in range(2)]
    for p in procs:
        p.start()
    told: list[str] = []
    deadline = time.monotonic() + 60
    while len(told) < 150 and time.monotonic() < deadline:
        told.append(acked.get(timeout=60))
    for p in procs:
        os.kill(p.pid, signal.SIGKILL)  # type: ignore[arg-type]
    for p in procs:
        p.join()
    while not acked.empty():
        told.append(acked.get())
    got = _contents(tmp_path)
    counts = Counter(got)
    assert not [t for t, c in counts.items() if c > 1], "an append stored twice"
    assert not [t for t in told if t not in counts], "an acknowledged append lost"
    with SessionStore(tmp_path, durability="fsync") as s:
        s.append_transcript_messages(SID, _turn("after"))
    assert _contents(tmp_path)[-1] == "after"


def test_a_compaction_beside_grouping_writers_never_deadlocks(tmp_path: Path) -> None:
    """Writers grouping their durable appends while another thread of the same store
    compacts the session over and over (the compaction holds the store's session lock
    and then waits for the engine's, which a group may hold for writers queued behind
    that very lock: it commits the group first). Nothing hangs, and every append is
    in the history once, each writer's in its order."""
    each = 15
    stop = threading.Event()
    with SessionStore(tmp_path, durability="fsync") as s:
        s.append_transcript_messages(SID, _turn("seed"))

        def compactor() -> None:
            while not stop.is_set():
                s.compact(SID, force=True)

        def writers_then_stop(w: int) -> None:
            try:
                for i in range(each):
                    s.append_transcript_messages(SID, _turn(f"w{w}.{i}"))
            finally:
                if w == 0:
                    stop.set()

        targets = [lambda w=w: writers_then_stop(w) for w in range(WRITERS)]  # type: ignore[misc]
        errors = run_threads([*targets, compactor], seconds=120)
        stop.set()
        assert not errors, errors
    got = _contents(tmp_path)
    assert got[0] == "seed"
    _in_writer_order(got[1:], WRITERS, each)


def test_a_sealing_store_with_concurrent_durable_writers_never_deadlocks(
    tmp_path: Path,
) -> None:
    """A store that seals every few lines holds the session's lock around each write and
    its seal, so its writers wait at that lock and form no group, and neither the write
    nor the seal ever waits for a shared flush while holding it (the writers queued
    behind the lock would be the ones to commit it). Writers in threads all finish,
    every append stored once."""
    crypto = pytest.importorskip("cryptography.hazmat.primitives.asymmetric.ed25519")
    from eventstore import SealPolicy

    key = crypto.Ed25519PrivateKey.generate()
    each = 10
    with SessionStore(
        tmp_path, durability="fsync", signing_key=key, seal_policy=SealPolicy(every=3)
    ) as s:
        s.append_transcript_messages(SID, _turn("seed"))
        errors = run_threads(_writers(s, WRITERS, each), seconds=120)  # type: ignore[arg-type]
        assert not errors, errors
    got = [t for t in _contents(tmp_path) if t != "seed"]
    _in_writer_order(got, WRITERS, each)


def test_a_deletion_beside_grouping_writers_never_deadlocks(tmp_path: Path) -> None:
    """`delete_session(purge=True)` holds the store's session lock while the engine removes the
    session, whose locks a group may hold for writers queued behind that lock: the
    engine commits the group first. Deleting over and over beside the writers, nothing
    hangs; what they appended after the last deletion is there once each, in each
    writer's order."""
    each = 25
    done = threading.Event()
    with SessionStore(tmp_path, durability="fsync") as s:
        s.append_transcript_messages(SID, _turn("seed"))

        def deleter() -> None:
            while not done.is_set():
                s.delete_session(SID, purge=True)

        def writer(w: int) -> None:
            try:
                for i in range(each):
                    s.append_transcript_messages(SID, _turn(f"w{w}.{i}"))
            finally:
                done.set()

        targets = [lambda w=w: writer(w) for w in range(WRITERS)]  # type: ignore[misc]
        errors = run_threads([*targets, deleter], seconds=120)
        assert not errors, errors
        got = [m.content for m in s.load_transcript_messages(SID)]
    assert not got or Counter(got).most_common(1)[0][1] == 1
    for w in range(WRITERS):
        mine = [int(t.split(".")[1]) for t in got if t.startswith(f"w{w}.")]
        assert mine == list(range(each - len(mine), each))  # the appends after the deletion
