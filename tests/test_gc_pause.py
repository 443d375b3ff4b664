"""A cold load folds with the cyclic collector paused, and leaves it as it found it:
after an error, beside other threads' loads, with the collector already off, and in a
child forked while another thread holds a pause."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import in_forked_child, log_path

from eventstore import (
    CorruptLogError,
    Message,
    Role,
    SessionStore,
)
from eventstore.core.gc_pause import paused_gc
from eventstore.format.events import (
    Event,
    MessagesAppended,
)
from projections.base import StructProjection


class _Seen(StructProjection[list[bool]]):
    """Records, for each message batch it folds, whether the collector was on."""

    name = "gc_seen"
    version = 1
    pause_gc = True  # (a user's projection pauses only when it says its folds may)
    event_types = frozenset({"messages_appended"})
    state_type = list[bool]

    def initial(self) -> list[bool]:
        return []

    def apply(self, state: list[bool], event: Event) -> list[bool]:
        if isinstance(event, MessagesAppended):
            state.append(gc.isenabled())
        return state


@pytest.fixture(autouse=True)
def _collector_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    if was:
        gc.enable()  # (a test turns it off)
    else:
        gc.disable()


def _write(root: Path, n: int = 5) -> None:
    with SessionStore(root) as s:
        for i in range(n):
            s.append_transcript_messages("s", [Message(Role.USER, f"m{i}")])


def test_a_cold_load_folds_with_the_collector_off_and_turns_it_back_on(tmp_path: Path) -> None:
    _write(tmp_path)
    with SessionStore(tmp_path, projections=[_Seen()]) as s:
        assert s.load("s", "gc_seen") == [False] * 5
        assert gc.isenabled()
        s.append_transcript_messages("s", [Message(Role.USER, "late")])
        assert s.load("s", "gc_seen") == [False] * 5 + [True]  # a write: no pause
        with SessionStore(tmp_path) as other:
            other.append_transcript_messages("s", [Message(Role.USER, "other")])
        assert s.load("s", "gc_seen")[-1] is True  # a warm load folds a tail: no pause
        assert gc.isenabled()


def test_a_collector_already_off_stays_off(tmp_path: Path) -> None:
    _write(tmp_path)
    gc.disable()
    with SessionStore(tmp_path) as s:
        assert len(s.load_transcript_messages("s")) == 5
        assert len(s.load_bootstrap_state("s").feature_list) == 0
    assert not gc.isenabled()


def test_a_load_that_fails_turns_the_collector_back_on(tmp_path: Path) -> None:
    _write(tmp_path)
    log = log_path(tmp_path, "s")
    data = bytearray(log.read_bytes())
    data[data.index(b"m3")] = ord("x")  # same length, still JSON: fails its hash check
    log.write_bytes(bytes(data))
    with SessionStore(tmp_path) as s, pytest.raises(CorruptLogError):
        s.load_transcript_messages("s")
    assert gc.isenabled()


def test_overlapping_pauses_in_threads_resume_once_the_last_ends() -> None:
    inside = threading.Barrier(2)
    first_out = threading.Event()
    seen: list[bool] = []

    def hold(leave_first: bool) -> None:
        with paused_gc:
            inside.wait(5)
            if leave_first:
                return
            first_out.wait(5)
            seen.append(gc.isenabled())  # the other pause ended: still off

    t1 = threading.Thread(target=hold, args=(True,))
    t2 = threading.Thread(target=hold, args=(False,))
    t2.start()
    t1.start()
    t1.join(5)
    first_out.set()
    t2.join(5)
    assert seen == [False]
    assert gc.isenabled()


def test_a_child_forked_while_another_thread_holds_a_pause_has_the_collector_on() -> None:
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with paused_gc:
            held.set()
            release.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    try:
        assert held.wait(5)
        assert not gc.isenabled()

        def child() -> bool:
            if not gc.isenabled():
                return False
            with paused_gc:  # the child's own pauses still count from zero
                if gc.isenabled():
                    return False
            return gc.isenabled()

        assert in_forked_child(child, 10) == 0
    finally:
        release.set()
        t.join(5)
    assert gc.isenabled()
