"""Cold loads in small pieces racing a writer and a compactor, each in its own process.

A reader opens a fresh store for every load (so it uses whatever checked prefix the
others saved, hashes it on the side thread, and reads pieces as views of its buffers)
while one process appends transcript messages and another compacts (installing
snapshots that vouch for themselves). Every load must return a prefix of the writer's
messages, in order, never fewer than the load before, and never raise.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import in_forked_child
from tuning import tune

from eventstore import SessionStore
from eventstore.core import tuning
from eventstore.core.tuning import Tuning
from eventstore.records import (
    Message,
    Role,
)

pytestmark = pytest.mark.slow  # loads racing a writer and a compactor, each in its own process

SID = "race"


def _text(i: int) -> str:
    return f"m{i} " + "w" * (i * 53 % 900)


def _writer(root: str, seconds: float, out: str) -> None:
    deadline = time.monotonic() + seconds
    n = 1  # message 0 is the one the test wrote before
    with SessionStore(root) as s:
        while time.monotonic() < deadline:
            s.append_transcript_messages(SID, [Message(Role.USER, _text(n))])
            n += 1
            time.sleep(0.001)  # pacing only: the log stays small enough for many loads
    Path(out).write_text(str(n))
    os._exit(0)


def _compactor(root: str, stop: Any, out: str) -> None:
    n = 0
    with SessionStore(root) as s:
        while not stop.is_set():
            n += s.compact(SID, force=True).compacted
            stop.wait(0.02)  # pacing only
    Path(out).write_text(str(n))
    os._exit(0)


def _reader(root: str, stop: Any, out: str) -> None:
    # many pieces, most cut mid-batch (views); every checked piece hashed on the side thread
    tuning.DEFAULT_TUNING = Tuning(read_piece=2048, hash_aside=0)
    problems: list[str] = []
    loads = prev = 0
    while not stop.is_set():
        try:
            with SessionStore(root) as s:
                got = [m.content for m in s.load_transcript_messages(SID)]
        except Exception as exc:  # noqa: BLE001 - recorded, the test fails on it
            problems.append(f"load raised {exc!r}")
            continue
        if got != [_text(i) for i in range(len(got))]:
            problems.append(f"not a prefix at load {loads}: {[c[:6] for c in got[-3:]]}")
        if len(got) < prev:
            problems.append(f"went back: {len(got)} < {prev}")
        prev = len(got)
        loads += 1
    Path(out).write_text(f"{loads}\n" + "\n".join(problems))
    os._exit(0)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_cold_piecewise_loads_beside_a_writer_and_a_compactor(tmp_path: Path) -> None:
    root = tmp_path / "store"
    with SessionStore(root) as s:
        s.append_transcript_messages(SID, [Message(Role.USER, _text(0))])
    Path(tmp_path / "w.txt").write_text("")
    ctx = multiprocessing.get_context("fork")
    stop = ctx.Event()
    wout, cout, rout = (str(tmp_path / n) for n in ("w.txt", "c.txt", "r.txt"))
    writer = ctx.Process(target=_writer, args=(str(root), 3.0, wout))
    comp = ctx.Process(target=_compactor, args=(str(root), stop, cout))
    reader = ctx.Process(target=_reader, args=(str(root), stop, rout))
    for p in (writer, comp, reader):
        p.start()
    writer.join(60)
    stop.set()
    comp.join(60)
    reader.join(60)
    assert (writer.exitcode, comp.exitcode, reader.exitcode) == (0, 0, 0)
    loads, *problems = Path(rout).read_text().split("\n")
    assert not [p for p in problems if p], problems[:5]
    assert int(loads) >= 10 and int(Path(cout).read_text()) >= 3
    with SessionStore(root) as s:
        final = [m.content for m in s.load_transcript_messages(SID)]
    assert final == [_text(i) for i in range(int(Path(wout).read_text()))]


def test_a_cache_write_finishing_during_a_compaction_does_not_fail_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader writes caches without the writers' lock: a compaction that lists its
    temporary file as a stray may find it renamed in by the time it removes it."""
    from eventstore.engines.file import engine as file_module
    from eventstore.engines.file.caches import CACHE_PREFIX
    from eventstore.engines.file.layout import TMP_MARK

    root = tmp_path / "store"
    with SessionStore(root) as s:
        for i in range(50):
            s.append_transcript_messages(SID, [Message(Role.USER, _text(i))])
    session_dir = root / "sessions" / SID
    pending = session_dir / f"{CACHE_PREFIX}x{TMP_MARK}1234"
    pending.write_bytes(b"a cache being written")
    real = os.listdir

    def listdir(path: Any) -> list[str]:
        names = real(path)
        if Path(path) == session_dir and pending.exists():
            pending.rename(session_dir / f"{CACHE_PREFIX}x")  # the writer's rename
        return names

    monkeypatch.setattr(file_module.os, "listdir", listdir)
    with SessionStore(root) as s:
        assert s.compact(SID, force=True).compacted
        assert [m.content for m in s.load_transcript_messages(SID)] == [_text(i) for i in range(50)]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_child_forked_during_a_piecewise_load_can_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thread keeps loading cold, in pieces, its checked prefix hashed on a side
    thread, while the main thread forks: each child loads through the inherited store
    and a new one, and exits; none hangs on a lock or a queue of the parent's."""
    import threading

    tune(monkeypatch, read_piece=4096)
    tune(monkeypatch, hash_aside=0)
    root = tmp_path / "store"
    with SessionStore(root) as s:
        for i in range(400):
            s.append_transcript_messages(SID, [Message(Role.USER, _text(i))])
    expected = [_text(i) for i in range(400)]
    stop = threading.Event()
    shared = SessionStore(root)
    loads = [0]

    def loader() -> None:
        while not stop.is_set():
            with SessionStore(root) as s:  # a new store: a cold load every time
                assert [m.content for m in s.load_transcript_messages(SID)] == expected
            loads[0] += 1

    t = threading.Thread(target=loader)
    t.start()
    try:
        for _ in range(10):
            time.sleep(0.01)

            def child() -> bool:
                with SessionStore(root) as s:
                    ok = [m.content for m in s.load_transcript_messages(SID)] == expected
                return ok and [m.content for m in shared.load_transcript_messages(SID)] == expected

            code = in_forked_child(child, 20)
            if code is None:
                pytest.fail("a child forked during a load hung")
            assert code == 0
    finally:
        stop.set()
        t.join()
        shared.close()
    assert loads[0] > 0
