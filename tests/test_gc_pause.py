"""A cold load folds with the cyclic collector paused, and leaves it as it found it:
after an error, beside other threads' loads, with the collector already off, and in a
child forked while another thread holds a pause."""

from __future__ import annotations

import gc
import os
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import pytest
from conftest import in_forked_child, log_path, make_entry

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

pytestmark = pytest.mark.usefixtures("collector_on")


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


# -- attacks: nested, failing, forked and threaded cold loads ------------------------------
#
# A load never keeps (in memory or in a side file) a state built from bytes that failed
# their check, and leaves the collector as it found it.


SID = "s"


class _Nesting(StructProjection[dict[str, int]]):
    """Counts every event, its fold kept in the fold cache; while `nest` is set, its
    apply loads another session of the same store after counting (a projection that
    looks something up, a logging hook...)."""

    name = "nesting"
    version = 1
    event_types = None
    state_type = dict[str, int]
    cache_folds = True

    def __init__(self) -> None:
        self.store: SessionStore | None = None
        self.nest = False

    def initial(self) -> dict[str, int]:
        return {"n": 0}

    def apply(self, state: dict[str, int], event: Event) -> dict[str, int]:
        state["n"] += 1  # in place, as the protocol allows
        if self.nest:
            self.nest = False
            assert self.store is not None
            self.store.load_bootstrap_state("other")
        return state


def test_a_nested_load_never_saves_a_half_folded_state_as_a_fold_cache(
    tmp_path: Path,
) -> None:
    """A load whose projection's apply loads another session (brief item 1: nested
    loads): with the store's session cache full, that load evicts the session being
    folded, and eviction saves its fold cache (`_save_caches`, through the RLock the
    folding thread already holds) while the piece is half folded in place: the state
    holds the first new event, the head is the one before it. Every later cold load
    (this store's next, another process's) counts that event twice."""
    root = tmp_path / "store"
    with SessionStore(root) as s:
        s.append_progress_entry("other", make_entry(0))
    proj = _Nesting()
    store = SessionStore(root, projections=[proj], cached_sessions=1)
    proj.store = store
    try:
        big = "x" * 2000
        for i in range(60):  # ~120 KB: past the 64 KiB a cache is saved for
            store.append_transcript_messages(SID, [Message(Role.USER, f"{i} {big}")])
        assert store.load(SID, "nesting") == {"n": 60}
        with SessionStore(root) as writer:  # another process appends three events
            for i in range(3):
                writer.append_progress_entry(SID, make_entry(i))
        proj.nest = True
        assert store.load(SID, "nesting") == {"n": 63}
        # the session was evicted by the nested load: the next load is cold
        assert store.load(SID, "nesting") == {"n": 63}  # fails: {"n": 64}
    finally:
        store.close()
    with SessionStore(root, projections=[_Nesting()]) as fresh:
        assert fresh.load(SID, "nesting") == {"n": 63}


class _Holder:
    __slots__ = ("__weakref__", "me", "pad")

    def __init__(self) -> None:
        self.pad = bytearray(1024)
        self.me = self  # a cycle: only the cyclic collector frees it


class _Cyclic(StructProjection[dict[str, int]]):
    """A projection whose apply makes short-lived cyclic garbage (a node with a parent
    pointer, say, built and dropped per event), and records how many of those are
    alive, uncollected, at once."""

    name = "cyclic"
    version = 1
    event_types = None
    state_type = dict[str, int]

    def __init__(self) -> None:
        self.alive = 0
        self.peak = 0
        self.refs: list[weakref.ref[_Holder]] = []

    def initial(self) -> dict[str, int]:
        return {"n": 0}

    def _gone(self, _ref: object) -> None:
        self.alive -= 1

    def apply(self, state: dict[str, int], event: Event) -> dict[str, int]:
        self.refs.append(weakref.ref(_Holder(), self._gone))
        self.alive += 1
        self.peak = max(self.peak, self.alive)
        state["n"] += 1
        return state


def test_a_cold_load_does_not_keep_a_user_projection_s_cyclic_garbage(
    tmp_path: Path,
) -> None:
    """gc_pause's docstring: "Decoded records cannot form cycles, so nothing is lost by
    collecting after the load": true of the built-in projections, not of a user's, whose
    apply may make cyclic garbage, yet `load(sid, projection)` pauses the collector for
    any projection. With the collector on, a few hundred of those cycles are alive at
    once (generation 0 runs every 700 allocations); paused, every one of them is until
    the load ends: memory grows with the length of the log (here 1 KiB per event; a
    100,000-event log, 100 MiB)."""
    root = tmp_path / "store"
    n = 6000
    with SessionStore(root) as s:
        for i in range(n):
            s.append_progress_entry(SID, make_entry(i))
    proj = _Cyclic()
    assert gc.isenabled()
    with SessionStore(root, projections=[proj]) as s:
        assert s.load(SID, "cyclic") == {"n": n}
    gc.collect()
    assert gc.isenabled() and proj.alive == 0
    assert proj.peak < n // 4, f"{proj.peak} of {n} cyclic garbage objects alive at once"


def test_loads_in_many_threads_with_failures_leave_the_collector_as_it_was(
    tmp_path: Path,
) -> None:
    """Cold loads overlapping in threads (each its own store: every load is cold), some
    failing in their projection's apply, some nesting a cold load of another session,
    never leave the collector off, and leave it off when it was off."""

    class Flaky(_Nesting):
        name = "flaky"
        cache_folds = False

        def apply(self, state: dict[str, int], event: Event) -> dict[str, int]:
            state["n"] += 1
            kind = threading.current_thread().name
            if kind.endswith("fail") and state["n"] == 3:
                raise RuntimeError("boom")
            if kind.endswith("nest") and state["n"] == 2 and self.store is not None:
                self.store.load(f"{SID}-x", "flaky")
            return state

    root = tmp_path / "store"
    with SessionStore(root) as s:
        for sid in (SID, f"{SID}-x"):
            for i in range(5):
                s.append_progress_entry(sid, make_entry(i))
    for enabled in (True, False, True):
        (gc.enable if enabled else gc.disable)()
        try:
            errors: list[BaseException] = []
            results: list[Any] = []

            def run(errors: list[BaseException] = errors, results: list[Any] = results) -> None:
                proj = Flaky()
                with SessionStore(root, projections=[proj]) as s:
                    proj.store = s
                    try:
                        results.append(s.load(SID, "flaky"))
                    except RuntimeError as exc:
                        errors.append(exc)

            threads = [
                threading.Thread(target=run, name=f"t{i}-{kind}")
                for i in range(4)
                for kind in ("ok", "fail", "nest")
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(10)
            assert not any(t.is_alive() for t in threads)
            assert len(errors) == 4 and results == [{"n": 5}] * 8
            assert gc.isenabled() is enabled
        finally:
            gc.enable()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_fork_from_inside_a_cold_load_gives_the_child_its_collector(tmp_path: Path) -> None:
    """A projection's apply forks (the forking thread itself holds the pause): the
    child has the collector on at once, finishes the load with the right state and
    loads again; the parent's pause ends with its load."""
    parent = os.getpid()

    class Forking(_Nesting):
        name = "forking"
        cache_folds = False

        def __init__(self) -> None:
            super().__init__()
            self.child = 0

        def apply(self, state: dict[str, int], event: Event) -> dict[str, int]:
            state["n"] += 1
            if state["n"] == 3 and not self.child:
                self.child = os.fork() or -1
                if self.child == -1 and not gc.isenabled():
                    os._exit(2)
            return state

    root = tmp_path / "store"
    with SessionStore(root) as s:
        for i in range(10):
            s.append_progress_entry(SID, make_entry(i))
    proj = Forking()
    s = SessionStore(root, projections=[proj])
    try:
        got = s.load(SID, "forking")
    finally:
        if os.getpid() != parent:  # the child never returns into pytest
            try:
                ok = got == {"n": 10} and gc.isenabled()
                ok = ok and s.load(SID, "forking") == {"n": 10} and gc.isenabled()
            finally:
                os._exit(0 if ok else 3)  # noqa: B012
    s.close()
    assert proj.child > 0
    assert got == {"n": 10} and gc.isenabled()
    for _ in range(200):
        pid, status = os.waitpid(proj.child, os.WNOHANG)
        if pid:
            break
        time.sleep(0.05)
    else:
        os.kill(proj.child, 9)
        os.waitpid(proj.child, 0)
        pytest.fail("the forked child did not finish in 10 s")
    assert os.waitstatus_to_exitcode(status) == 0
