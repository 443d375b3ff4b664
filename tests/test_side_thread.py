"""The load's side thread (eventstore.core.side_thread): calls run in order, a call's
exception reaches the caller, nothing outlives `close`, and a checked prefix hashed on
it proves exactly what the same prefix hashed inline does."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import check_whole, log_path
from tuning import tune

from eventstore import SessionStore
from eventstore.core import fold_loop as fold_loop_module
from eventstore.core.side_thread import SideThread
from eventstore.errors import CorruptLogError
from eventstore.records import (
    Message,
    Role,
)

# these tests attack how a load reads and checks the log: no transcript fold cache
# stands in for it (see conftest.no_transcript_cache)
pytestmark = pytest.mark.usefixtures("no_transcript_cache")


def test_calls_run_in_order_and_return_their_results() -> None:
    side = SideThread()
    done: list[int] = []

    def slow(i: int) -> int:
        time.sleep(0.01 if i == 0 else 0)
        done.append(i)
        return i * i

    jobs = [side.submit(slow, i) for i in range(5)]
    assert [j.result() for j in jobs] == [0, 1, 4, 9, 16] and done == [0, 1, 2, 3, 4]
    side.close()


def test_an_exception_is_raised_where_the_result_is_asked_for() -> None:
    side = SideThread()
    job = side.submit(int, "not a number")
    after = side.submit(len, b"abc")
    with pytest.raises(ValueError, match="not a number"):
        job.result()
    assert after.result() == 3  # the thread goes on after a failed call
    side.close()


def test_close_waits_for_the_calls_and_ends_the_thread() -> None:
    before = set(threading.enumerate())
    side = SideThread()
    done: list[bool] = []
    side.submit(lambda: (time.sleep(0.02), done.append(True)))
    side.close()
    assert done == [True] and set(threading.enumerate()) == before


def _fill(root: Path) -> None:
    with SessionStore(root) as s:  # ~300 KB
        for i in range(200):
            s.append_transcript_messages("s", [Message(Role.USER, f"{i} " + "x" * 1500)])
    check_whole(root, "s")  # a reader's checked prefix, saved on its close


@pytest.mark.parametrize("aside", [0, 1 << 40], ids=["hashed aside", "hashed inline"])
def test_a_prefix_hashed_either_way_proves_the_same_and_catches_an_edit(
    root: Path, monkeypatch: pytest.MonkeyPatch, aside: int
) -> None:
    tune(monkeypatch, hash_aside=aside)
    tune(monkeypatch, read_piece=64 << 10)  # many pieces
    _fill(root)
    before = set(threading.enumerate())
    with SessionStore(root) as s:
        got = s.load_transcript_messages("s")
    assert [m.content.split()[0] for m in got] == [str(i) for i in range(200)]
    assert set(threading.enumerate()) == before  # the load left no thread behind
    log = log_path(root, "s")
    data = log.read_bytes()
    at = data.index(b"x" * 1500, len(data) // 2) + 10
    log.write_bytes(data[:at] + b"y" + data[at + 1 :])  # same length, still JSON
    with SessionStore(root) as s, pytest.raises(CorruptLogError):
        s.load_transcript_messages("s")
    assert set(threading.enumerate()) == before


def test_a_load_where_no_thread_can_start_hashes_inline(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import _thread

    _fill(root)

    def refuse(*a: object) -> None:
        raise RuntimeError("can't start new thread")

    trusted: list[int] = []
    real = fold_loop_module.read_lines

    def read_lines(buf: Any, *a: Any, hashes_checked: bool = False, **kw: Any) -> Any:
        if hashes_checked:
            trusted.append(len(buf))
        return real(buf, *a, hashes_checked=hashes_checked, **kw)

    monkeypatch.setattr(fold_loop_module, "read_lines", read_lines)
    tune(monkeypatch, hash_aside=0)
    monkeypatch.setattr(_thread, "start_new_thread", refuse)
    with SessionStore(root) as s:
        got = s.load_transcript_messages("s")
    assert [m.content.split()[0] for m in got] == [str(i) for i in range(200)]
    assert sum(trusted) == log_path(root, "s").stat().st_size  # the prefix still served
